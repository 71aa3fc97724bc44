"""The serving app's hand-written statements.

`notify_routes` is PostgreSQL's NOTIFY, sent inside the transaction that changed a service's
routing table (a replica ready, no longer ready, gone, the run stopped): PostgreSQL delivers it
only when that transaction commits, so an endpoint process that LISTENs re-reads the table after
the change is visible and never for a change that rolled back. SQLite has no notification: the
endpoint re-reads on a short timer there (serving/proxy/).
"""

from __future__ import annotations

from django.db import connection

CHANNEL = "muster_routes"


def notify_routes(run_id: int) -> None:
    """Tell every endpoint process, on commit, that run `run_id`'s replicas changed."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [CHANNEL, str(run_id)])



async def listen_routes(aconnection) -> None:
    """Subscribe a psycopg AsyncConnection (autocommit) to `notify_routes`'s channel; its
    `notifies()` then yields one notification per committed change, payload the run id."""
    await aconnection.execute(f"LISTEN {CHANNEL}")
