"""The endpoint's database reads, as its threads make them (the ORM is synchronous).

Each read is framed as Django frames a request, connections checked before and after, so the
backend's skipped health check (muster/postgresql/base.py: none within a second of a clean use)
counts from the end of the last read, not from the start of this one. A connection PostgreSQL
closed meanwhile (a restart, a failover, an administrator, an idle timeout) fails its first
statement; the read is then made once more on a new connection instead of failing the request:
every read here is a plain SELECT, so a second try cannot do anything twice.
"""

from __future__ import annotations

import logging

log = logging.getLogger("muster.endpoint")


def read(fn, *args):
    from django.db import close_old_connections, connection
    from django.db.utils import InterfaceError, OperationalError

    close_old_connections()
    try:
        try:
            return fn(*args)
        except (OperationalError, InterfaceError) as exc:
            log.warning("database read %s failed (%s); once more on a new connection", fn.__name__, exc)
            connection.close()
            return fn(*args)
    finally:
        close_old_connections()
