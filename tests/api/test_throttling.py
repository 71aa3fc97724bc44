"""Request rates per caller: over the configured rate is a 429 with Retry-After."""

from __future__ import annotations

import pytest
from django.core.cache import cache

from tests.conftest import client_for

pytestmark = pytest.mark.django_db

RUNS = "/api/projects/main/runs/"


@pytest.fixture(autouse=True)
def _fresh_counters():
    cache.clear()
    yield
    cache.clear()


def test_a_caller_over_the_user_rate_gets_a_429_and_others_do_not(api, make_user, settings):
    settings.MUSTER = {**settings.MUSTER, "THROTTLE_USER": "3/min"}
    assert [api.get(RUNS).status_code for _ in range(3)] == [200, 200, 200]
    resp = api.get(RUNS)
    assert resp.status_code == 429
    assert int(resp.headers["Retry-After"]) > 0
    assert client_for(make_user("bob", role="user")).get(RUNS).status_code == 200, "counted per caller"


def test_anonymous_callers_of_what_is_open_to_them_have_their_own_rate(settings):
    # the schema is open without a token outside production, and costly to build
    settings.MUSTER = {**settings.MUSTER, "THROTTLE_ANON": "2/min"}
    anon = client_for(None)
    assert [anon.get("/api/schema/").status_code for _ in range(3)] == [200, 200, 429]


def test_an_empty_rate_means_no_limit(api, settings):
    settings.MUSTER = {**settings.MUSTER, "THROTTLE_USER": ""}
    assert {api.get(RUNS).status_code for _ in range(20)} == {200}
