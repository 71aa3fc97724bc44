"""The PostgreSQL backend's health check (muster/postgresql): skipped on a connection that a request
or task has just used cleanly, sent on one that sat idle, and a connection killed under a request
never outlives it.

Each test drives its own connection through what Django's request signals and Celery's task
signals do (`close_if_unusable_or_obsolete` at a request's start and end) and kills its server
process from another connection, as a PostgreSQL restart or a dropped network path would.
"""

from __future__ import annotations

import pytest
from django.db import DatabaseError, connection, connections

from muster.postgresql import base

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.skipif(connection.vendor != "postgresql", reason="the backend is PostgreSQL's")]


@pytest.fixture
def conn():
    fresh = connections.create_connection("default")
    fresh.settings_dict["CONN_HEALTH_CHECKS"] = True
    fresh.settings_dict["CONN_MAX_AGE"] = 600
    assert isinstance(fresh, base.DatabaseWrapper)
    yield fresh
    fresh.close()


def request(conn, sql: str = "SELECT 1 + 1") -> int:
    """One request's life on `conn`, as Django's handler gives it: returns what the statement read."""
    conn.close_if_unusable_or_obsolete()  # request_started
    try:
        with conn.cursor() as cursor:
            cursor.execute(sql)
            return cursor.fetchone()[0]
    finally:
        conn.close_if_unusable_or_obsolete()  # request_finished


def checks_of(conn, monkeypatch) -> list[bool]:
    sent: list[bool] = []
    real = conn.is_usable

    def counted():
        sent.append(real())
        return sent[-1]

    monkeypatch.setattr(conn, "is_usable", counted)
    return sent


def kill_server_side(conn) -> None:
    pid = conn.connection.info.backend_pid
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        assert cursor.fetchone()[0]


def idle_past_the_window(conn) -> None:
    conn._good_at -= base.FRESH_SECONDS + 1


def test_requests_close_together_send_no_health_check(conn, monkeypatch):
    assert request(conn) == 2  # a new connection is healthy by definition
    checks = checks_of(conn, monkeypatch)
    for _ in range(5):
        assert request(conn) == 2
    assert checks == []


def test_a_connection_idle_past_the_window_is_checked_and_replaced_when_dead(conn, monkeypatch):
    request(conn)
    first = conn.connection.info.backend_pid
    kill_server_side(conn)
    idle_past_the_window(conn)
    checks = checks_of(conn, monkeypatch)
    assert request(conn) == 2  # the dead connection never reached the request
    assert checks == [False]
    assert conn.connection.info.backend_pid != first


def test_a_connection_idle_past_the_window_and_alive_is_kept(conn, monkeypatch):
    request(conn)
    first = conn.connection.info.backend_pid
    idle_past_the_window(conn)
    checks = checks_of(conn, monkeypatch)
    assert request(conn) == 2
    assert checks == [True]
    assert conn.connection.info.backend_pid == first


def test_a_connection_killed_inside_the_window_fails_one_request_and_is_then_replaced(conn):
    request(conn)
    first = conn.connection.info.backend_pid
    kill_server_side(conn)
    with pytest.raises(DatabaseError):
        request(conn)
    assert conn.connection is None, "closed at the end of the request that saw it break"
    assert request(conn) == 2
    assert conn.connection.info.backend_pid != first


def test_a_request_that_ran_no_statement_does_not_renew_the_window(conn, monkeypatch):
    request(conn)
    idle_past_the_window(conn)
    for _ in range(3):  # requests that never touch the database (a static file, a 404 before any read)
        conn.close_if_unusable_or_obsolete()
        conn.close_if_unusable_or_obsolete()
    checks = checks_of(conn, monkeypatch)
    assert request(conn) == 2
    assert checks == [True], "the connection was last proved long ago: it is checked"
