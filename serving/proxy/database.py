"""The endpoint's database reads, as its threads make them (the ORM is synchronous).

Each read is framed as Django frames a request, connections checked before and after, so the
backend's skipped health check (muster/postgresql/base.py: none within a second of a clean use)
counts from the end of the last read, not from the start of this one. A kept connection
PostgreSQL closed within that second (a restart, a failover, an administrator) fails its first
statement; the read is then made once more on a new connection instead of failing the request:
every read here is a plain SELECT, so a second try cannot do anything twice. A new connection
that fails is not tried again: the database is away, and the caller says so (server.py, a 503).
"""

from __future__ import annotations

import logging

log = logging.getLogger("muster.endpoint")


def away(exc: BaseException) -> bool:
    """The database could not be reached or dropped the connection (not a bad statement)."""
    from django.db.utils import InterfaceError, OperationalError

    return isinstance(exc, OperationalError | InterfaceError)


def read(fn, *args):
    from django.db import close_old_connections, connection

    close_old_connections()
    kept = connection.connection is not None
    try:
        try:
            return fn(*args)
        except Exception as exc:
            if not (kept and away(exc)):
                raise
            log.warning("database read %s failed on a kept connection (%s); once more on a new one",
                        fn.__name__, exc)
            connection.close()
            return fn(*args)
    finally:
        close_old_connections()
