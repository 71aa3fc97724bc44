"""The endpoint's database connections closed by PostgreSQL (a restart, a failover, an
administrator) while requests stream in: the reads they were for are made again on new
connections, and no request fails (serving/proxy/database.py)."""

from __future__ import annotations

import time

import psycopg
import pytest
import requests
from django.db import connection

from tests.conftest import token_for
from tests.serving.test_endpoint import endpoint, make_service, port, replicas, url  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _close_the_endpoints_connections() -> int:
    """pg_terminate_backend on every other client of the test database: here, only the endpoint's."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "
                       "AND pid <> pg_backend_pid() AND backend_type = 'client backend'")
        return len(cursor.fetchall())


def test_connections_postgresql_closed_are_replaced_and_every_request_succeeds(
        endpoint, replicas, port, make_user):  # noqa: F811
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's own connections")
    (a,) = replicas("a")
    make_service("kept", [a], port, auth=True)
    headers = {"Authorization": f"Bearer {token_for(make_user('member', project='main', role='user'))}"}
    codes = []

    def stream(seconds: float) -> None:
        # the token is checked again every MUSTER_ENDPOINT_AUTH_CACHE (0.5 s here): within a second
        # of the last check, when the backend takes the connection as alive without asking
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            codes.append(requests.get(url(endpoint, "kept"), headers=headers, timeout=10).status_code)
            time.sleep(0.05)

    stream(1.5)
    for _ in range(3):
        assert _close_the_endpoints_connections() > 0
        stream(1.2)
    # a service read for the first time, on a connection closed since its last read
    make_service("new", [a], port, auth=True)
    assert _close_the_endpoints_connections() > 0
    codes.append(requests.get(url(endpoint, "new"), headers=headers, timeout=10).status_code)
    assert codes and set(codes) == {200}, (codes, endpoint.output()[-3000:])
    assert "once more on a new connection" in endpoint.output()


def test_a_database_that_stays_away_is_a_503_that_says_so_and_a_known_service_still_answers(
        endpoint, replicas, port, make_user):  # noqa: F811
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's own connections")
    (a,) = replicas("a")
    make_service("open", [a], port, auth=False)
    make_service("later", [a], port, auth=False)
    assert requests.get(url(endpoint, "open"), timeout=10).status_code == 200
    db = connection.settings_dict
    # from another database: PostgreSQL refuses this for the database a session is on
    admin = psycopg.connect(host=db["HOST"], port=db["PORT"], user=db["USER"], password=db["PASSWORD"] or None,
                            dbname="postgres", autocommit=True)
    try:
        admin.execute(f'ALTER DATABASE "{db["NAME"]}" ALLOW_CONNECTIONS false')
        assert _close_the_endpoints_connections() > 0
        away = requests.get(url(endpoint, "later"), timeout=10)  # never read: it needs the database
        assert away.status_code == 503 and "cannot read its database" in away.json()["detail"], away.text
        assert requests.get(url(endpoint, "open"), timeout=10).status_code == 200, "its routes are in memory"
    finally:
        admin.execute(f'ALTER DATABASE "{db["NAME"]}" ALLOW_CONNECTIONS true')
        admin.close()
    assert requests.get(url(endpoint, "later"), timeout=10).status_code == 200
