"""The events table's hand-written statements: its INSERT, written once for every writer that adds
events inside a larger statement (a status move and its event, the ends of a run's unstarted jobs,
a submit's run, jobs and event), and the move-with-its-event statement itself.

On PostgreSQL a data-modifying `WITH` lets the events' INSERT read the rows an UPDATE (or INSERT)
touched through its RETURNING, so a status change and its event are one round trip and atomic
without a transaction of their own. Columns are named from Event's `_meta`.
"""

from __future__ import annotations

from django.db import connection
from django.utils import timezone

from events.models import Event

# The columns of an event its writer gives (`created` is the statement's own, from timezone.now()).
ENTRY = ("project_id", "subject", "message", "status", "actor", "run_id", "job_id", "instance_id")


def insert_select(exprs: dict[str, str], source: str, returning: str = "") -> str:
    """`INSERT INTO <events> (<columns>) SELECT <exprs> FROM <source> [RETURNING ...]`: `exprs`
    maps each field's name (or attname) to its SQL expression, a parameter (`%s`) or one over
    `source`'s columns."""
    quote = connection.ops.quote_name
    columns = ", ".join(quote(Event._meta.get_field(name).column) for name in exprs)
    sql = f"INSERT INTO {quote(Event._meta.db_table)} ({columns}) SELECT {', '.join(exprs.values())} FROM {source}"
    return f"{sql} RETURNING {returning}" if returning else sql


def column(name: str) -> str:
    """An event field's column, quoted, for a RETURNING or a WHERE."""
    return connection.ops.quote_name(Event._meta.get_field(name).column)


def update_with_event(update: tuple[str, list], pk_column: str, entry: dict) -> int:
    """PostgreSQL: the UPDATE `update` (sql, params) and, for each row it touched, the event `entry`
    (ENTRY's names), as one statement. Returns the rows updated; no event without an update."""
    values = {**entry, "created": timezone.now()}
    fields = [Event._meta.get_field(name) for name in values]
    statement = (f"WITH moved AS ({update[0]} RETURNING {connection.ops.quote_name(pk_column)}) "
                 + insert_select(dict.fromkeys(values, "%s"), "moved"))
    params = [f.get_db_prep_save(value, connection) for f, value in zip(fields, values.values(), strict=True)]
    with connection.cursor() as cursor:
        cursor.execute(statement, [*update[1], *params])
        return cursor.rowcount
