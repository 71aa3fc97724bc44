"""The claim protocol's own statements, written out once per shape instead of built by the ORM each call.

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


def take_one(model, pk, now, until, token: str, conditions: dict) -> tuple[int, bool]:
    """`take` for one row, its SQL compiled once per (model, conditions), and in
    the same statement whether somebody else holds the row (for /metrics' claim conflicts: a row that
    moved on, the usual duplicate nudge, is no conflict). Returns (rows leased, held by another)."""
    free, held = _claim_reads(model, conditions)
    free_sql, free_params = free.statement(now, pk)
    held_sql, held_params = held.statement(now, pk)
    meta = model._meta
    quote = connection.ops.quote_name
    sql = (f"WITH taken AS (UPDATE {quote(meta.db_table)} SET {quote(meta.get_field('lease_until').column)} = %s, "
           f"{quote(meta.get_field('lease_token').column)} = %s WHERE {quote(meta.pk.column)} IN "
           f"({free_sql} FOR UPDATE SKIP LOCKED) RETURNING 1) "
           f"SELECT (SELECT count(*) FROM taken), EXISTS ({held_sql})")
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
    ops = connection.ops
    sql = (f"UPDATE {ops.quote_name(meta.db_table)} SET {ops.quote_name(meta.get_field('lease_until').column)} = %s, "
           f"{ops.quote_name(meta.get_field('lease_token').column)} = %s WHERE {ops.quote_name(meta.pk.column)} IN "
           f"({select} FOR UPDATE SKIP LOCKED) RETURNING {ops.quote_name(meta.pk.column)}")
    field = meta.get_field("lease_until")
    with connection.cursor() as cursor:
        cursor.execute(sql, [field.get_db_prep_value(until, connection), token, *params])
        return [row[0] for row in cursor.fetchall()]


# (model, field names, how many statuses) -> the give-back's UPDATE, written once
_GIVE_BACKS: dict[tuple, str] = {}


def give_back_one(model, pk, token: str, expect: tuple, fields: dict) -> int | None:
    """`UPDATE ... SET lease_until = NULL, lease_token = '', <fields> WHERE pk AND lease_token AND
    status IN (expect)`, the give-back of one row; the rows touched (0 or 1). None when a field's value
    is an expression, which only the ORM can write (the caller then does)."""
    if any(hasattr(value, "resolve_expression") for value in fields.values()):
        return None
    meta = model._meta
    names = tuple(sorted(fields))
    key = (model, names, len(expect), connection.vendor)
    sql = _GIVE_BACKS.get(key)
    if sql is None:
        quote = connection.ops.quote_name
        sets = ", ".join(f"{quote(meta.get_field(name).column)} = %s"
                         for name in ("lease_until", "lease_token", *names))
        guard = f" AND {quote(meta.get_field('status').column)} IN ({', '.join(['%s'] * len(expect))})" if expect else ""
        sql = _GIVE_BACKS[key] = (f"UPDATE {quote(meta.db_table)} SET {sets} WHERE {quote(meta.pk.column)} = %s "
                                  f"AND {quote(meta.get_field('lease_token').column)} = %s{guard}")
    values = [None, "", *(meta.get_field(name).get_db_prep_save(fields[name], connection) for name in names)]
    with connection.cursor() as cursor:
        cursor.execute(sql, [*values, pk, token, *expect])
        return cursor.rowcount
