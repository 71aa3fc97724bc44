"""Test database names of one test run, and the databases of runs that ended without dropping them.

Every database of a run ends in `_r<pid>` (the pid of the run's pytest process; xdist workers read
it from MUSTER_TEST_RUN). A run killed before its teardown, or a teardown refused because a
worker thread still held a connection, leaves its databases behind; the next run on this machine
drops those whose process is gone, and each run drops its own at its end.
"""

from __future__ import annotations

import os
import re

# `_p<pid>` was the first form of the suffix, still left by runs of that code
NAME = re.compile(r"^test_.*_[rp](\d+)$")


def run_suffix() -> str:
    return f"r{os.environ.get('MUSTER_TEST_RUN') or os.getpid()}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def drop_databases_of_ended_runs() -> list[str]:
    return _drop(lambda pid: not _alive(pid))


def drop_databases_of_this_run() -> list[str]:
    """At the run's end, after its workers: pytest-django's own drop fails while a thread of a
    test's Celery worker or live server still holds a connection, so this one forces it."""
    me = int(run_suffix()[1:])
    return _drop(lambda pid: pid == me)


def _drop(should_drop) -> list[str]:
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith(("postgres://", "postgresql://")):
        return []  # SQLite test databases are files named after the process (muster/settings.py)
    import dj_database_url
    import psycopg

    db = dj_database_url.parse(url)
    dropped = []
    try:
        conn = psycopg.connect(dbname="postgres", user=db["USER"] or None, password=db["PASSWORD"] or None,
                               host=db["HOST"] or None, port=db["PORT"] or None, autocommit=True,
                               connect_timeout=5)
    except psycopg.Error:
        return []  # the run itself will report an unreachable database
    with conn:
        names = [row[0] for row in conn.execute("SELECT datname FROM pg_database WHERE datname LIKE 'test\\_%'")]
        for name in names:
            match = NAME.match(name)
            if match and should_drop(int(match.group(1))):
                try:
                    conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                    dropped.append(name)
                except psycopg.Error:
                    pass  # another run dropped it first, or it is in use after all
    return dropped
