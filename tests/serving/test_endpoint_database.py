"""The endpoint's database connections closed by PostgreSQL (a restart, a failover, an
administrator) while requests stream in: the reads they were for are made again on new
connections, and no request fails (serving/proxy/database.py)."""

from __future__ import annotations

import time

import psycopg
import pytest
import requests
from django.db import connection
from django.db.utils import OperationalError, ProgrammingError

from serving.proxy import database
from tests.conftest import token_for
from tests.serving.test_endpoint import endpoint, make_service, port, replicas, url  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
postgresql_only = pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's own connections")


def _close_the_endpoints_connections() -> int:
    """pg_terminate_backend on every other client of the test database: here, only the endpoint's."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "
                       "AND pid <> pg_backend_pid() AND backend_type = 'client backend'")
        return len(cursor.fetchall())


def _failing(error: Exception, times: int):
    """A read that fails `times` times with `error`, then reads; what connection each call was on."""
    on = []

    def read_users():
        from django.contrib.auth.models import User

        on.append(connection.connection)
        if len(on) <= times:
            raise error
        return User.objects.count()
    return read_users, on


def test_a_read_failing_on_a_kept_connection_is_made_once_more_on_a_new_one_and_no_other_failure_is():
    connection.ensure_connection()
    read, on = _failing(OperationalError("server closed the connection unexpectedly"), 1)
    assert database.read(read) == 0
    assert len(on) == 2 and (on[0] is not on[1] or connection.vendor == "sqlite"), "the second on a new connection"
    for error, times in [(OperationalError("still away"), 2), (ProgrammingError("no such table"), 1)]:
        connection.ensure_connection()
        read, on = _failing(error, times)
        with pytest.raises(type(error)):
            database.read(read)
        assert len(on) == (2 if isinstance(error, OperationalError) else 1), "once more, never twice; a bad statement never"
    connection.close()
    read, on = _failing(OperationalError("could not connect"), 1)
    with pytest.raises(OperationalError):
        database.read(read)  # a new connection that fails: the database is away, not a kept connection lost
    assert len(on) == 1


@postgresql_only
def test_connections_postgresql_closed_are_replaced_and_every_request_succeeds(
        endpoint, replicas, port, make_user):  # noqa: F811
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
    # (whether a read met a closed connection or the health check found it first depends on which
    # thread took it: the retry itself is the test above's)
    assert codes and set(codes) == {200}, (codes, endpoint.output()[-3000:])


@postgresql_only
def test_a_database_that_stays_away_is_a_503_that_says_so_and_a_known_service_still_answers(
        endpoint, replicas, port, make_user):  # noqa: F811
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
