"""Idempotency-Key on run submission: a client retrying after a lost answer gets the same run."""

from __future__ import annotations

import pytest

from runs.models import Run
from tests.conftest import client_for

pytestmark = pytest.mark.django_db

RUNS = "/api/projects/main/runs/"
BODY = {"configuration": "type: task\ncommands: [echo once]\n"}


def submit(client, key=None, body=BODY):
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key is not None else {}
    return client.post(RUNS, body, format="json", **headers)


def test_the_same_key_twice_gives_the_same_run_once(api):
    first = submit(api, "3f1c2b7e-retry-me")
    assert first.status_code == 201, first.json()
    again = submit(api, "3f1c2b7e-retry-me")
    assert again.status_code == 201
    assert again.json()["name"] == first.json()["name"]
    assert again.headers["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first.headers
    assert Run.objects.count() == 1
    assert len(again.json()["jobs"]) == len(first.json()["jobs"])


def test_without_a_key_each_submission_is_a_new_run(api):
    assert submit(api).status_code == 201 and submit(api).status_code == 201
    assert Run.objects.count() == 2


def test_the_same_key_with_another_body_is_a_400_on_the_header(api):
    assert submit(api, "k1").status_code == 201
    resp = submit(api, "k1", {"configuration": "type: task\ncommands: [echo something else]\n"})
    assert resp.status_code == 400
    (error,) = resp.json()["errors"]
    assert error["loc"] == ["headers", "Idempotency-Key"]
    assert Run.objects.count() == 1


def test_keys_belong_to_their_caller(api, make_user):
    other = client_for(make_user("bob", role="user"))
    a, b = submit(api, "shared-key"), submit(other, "shared-key")
    assert a.status_code == b.status_code == 201
    assert a.json()["name"] != b.json()["name"]


@pytest.mark.parametrize("key", ["", "x" * 256, "has space", "ключ"])
def test_a_malformed_key_is_a_400_on_the_header(api, key):
    resp = submit(api, key)
    assert resp.status_code == 400, resp.content
    assert resp.json()["errors"][0]["loc"] == ["headers", "Idempotency-Key"]
    assert not Run.objects.exists()


def test_a_key_is_free_again_once_its_run_is_deleted(api):
    name = submit(api, "k2").json()["name"]
    Run.objects.filter(name=name).update(status="done")
    assert api.delete(f"{RUNS}{name}/").status_code == 204
    again = submit(api, "k2")
    assert again.status_code == 201 and "Idempotent-Replayed" not in again.headers
