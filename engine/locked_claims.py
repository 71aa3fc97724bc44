"""The claim protocol's own statements, written out once per shape instead of built by the ORM each call.

The rows module of the claim protocol (tests/test_rows_modules.py): its statements serve every
claimed model (jobs, runs, instance groups, fleets, hosts) and only engine/claims.py, so they live
beside it rather than in one app's rows.py.

PostgreSQL's claims: one statement each, in autocommit, skipping rows other transactions have
locked; engine/claims.py uses them where the database has `SELECT ... FOR UPDATE SKIP LOCKED` (on
SQLite a claim is an UPDATE in an IMMEDIATE transaction, which excludes every other writer). And the
give-back of one row, on every database.
"""

from __future__ import annotations

from datetime import datetime

from django.db import connection

from muster import compiled
from muster.claimable import unleased

# (model, conditions) -> the compiled reads of one claim: the row if free, the row if somebody holds it
_CLAIM_READS: dict[tuple, tuple[compiled.Select, compiled.Select]] = {}


def _claim_reads(model, conditions: dict) -> tuple[compiled.Select, compiled.Select]:
    key = (model, tuple(sorted((name, repr(value)) for name, value in conditions.items())))
    reads = _CLAIM_READS.get(key)
    if reads is None:
        free = compiled.Select(lambda now, pk: model.objects.filter(unleased(now), pk=pk, **conditions).values("pk"),
                               datetime, int)
        held = compiled.Select(lambda now, pk: model.objects.filter(pk=pk, **conditions).exclude(unleased(now))
                               .values("pk"), datetime, int)
        reads = _CLAIM_READS[key] = (free, held)
    return reads


def _lease(model, select: str, returning: str) -> str:
    """Lease the rows of `select` nobody has locked: UPDATE ... WHERE pk IN (select FOR UPDATE SKIP LOCKED)."""
    meta = model._meta
    quote = connection.ops.quote_name
    return (f"UPDATE {quote(meta.db_table)} SET {quote(meta.get_field('lease_until').column)} = %s, "
            f"{quote(meta.get_field('lease_token').column)} = %s WHERE {quote(meta.pk.column)} IN "
            f"({select} FOR UPDATE SKIP LOCKED) RETURNING {returning}")


def take_one(model, pk, now, until, token: str, conditions: dict) -> tuple[int, bool]:
    """`take` for one row, its SQL compiled once per (model, conditions), and in
    the same statement whether somebody else holds the row (for /metrics' claim conflicts: a row that
    moved on, the usual duplicate nudge, is no conflict). Returns (rows leased, held by another)."""
    free, held = _claim_reads(model, conditions)
    free_sql, free_params = free.statement(now, pk)
    held_sql, held_params = held.statement(now, pk)
    sql = f"WITH taken AS ({_lease(model, free_sql, '1')}) SELECT (SELECT count(*) FROM taken), EXISTS ({held_sql})"
    until = model._meta.get_field("lease_until").get_db_prep_value(until, connection)
    with connection.cursor() as cursor:
        cursor.execute(sql, [until, token, *free_params, *held_params])
        touched, conflict = cursor.fetchone()
    return touched, conflict and not touched


def take(queryset, limit: int | None, until, token: str) -> list:
    """PostgreSQL: lease the rows of `queryset` (up to `limit`) that no other transaction has
    locked, in one statement and so one round trip, in autocommit (a transaction around a single
    statement only adds a BEGIN and a COMMIT): UPDATE ... WHERE pk IN (SELECT ... FOR UPDATE SKIP
    LOCKED) RETURNING pk. Returns the pks leased. Concurrent claimers skip each other's rows
    instead of queueing, as with the SELECT FOR UPDATE it replaces."""
    model = queryset.model
    meta = model._meta
    inner = queryset.values("pk")
    if limit is not None:
        inner = inner[:limit]
    select, params = inner.query.sql_with_params()
    sql = _lease(model, select, connection.ops.quote_name(meta.pk.column))
    until = meta.get_field("lease_until").get_db_prep_value(until, connection)
    with connection.cursor() as cursor:
        cursor.execute(sql, [until, token, *params])
        return [row[0] for row in cursor.fetchall()]


def give_back_one(model, pk, token: str, expect: tuple, fields: dict, guard: dict | None = None) -> int | None:
    """`UPDATE ... SET lease_until = NULL, lease_token = '', <fields> WHERE pk AND lease_token AND
    status IN (expect) [AND guard]`, the give-back of one row (muster/compiled.row_update); the rows
    touched (0 or 1). None when a field's value is one only the ORM can write (the caller then does)."""
    where = {"lease_token": token, **({"status__in": expect} if expect else {}), **(guard or {})}
    update = compiled.row_update(model, pk, where, {"lease_until": None, "lease_token": "", **fields})
    if update is None:
        return None
    with connection.cursor() as cursor:
        cursor.execute(*update)
        return cursor.rowcount
