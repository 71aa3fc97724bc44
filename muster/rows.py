"""What every rows module shares: the one way a row of written SQL becomes a model instance, and the
one question that forks a statement between PostgreSQL and SQLite.

Hand-written SQL lives only in the rows modules (each app's `rows.py`, the claim protocol's
engine/locked_claims.py, muster/compiled.py and this one; tests/test_rows_modules.py): each
statement's text, its column list (from the model's `_meta`) and its fork sit in one place.
"""

from __future__ import annotations

import functools

from django.db import connection as default_connection
from django.db import connections


def one_statement(connection) -> bool:
    """Whether a write and what follows it (an event, the rows it read back) go as one data-modifying
    `WITH`, which PostgreSQL has; elsewhere (SQLite) they are the ORM's statements in the caller's
    transaction. Each rows statement asks this once, at its top."""
    return connection.vendor == "postgresql"


def columns(model, names: tuple[str, ...] | None = None) -> list:
    """The model's concrete fields, all of them or those of `names` (field names), in the model's
    order (the one Model.from_db takes a subset of columns in)."""
    fields = model._meta.concrete_fields
    return list(fields) if names is None else [f for f in fields if f.name in names or f.attname in names]


def column_list(model, alias: str, names: tuple[str, ...] | None = None) -> str:
    """`alias."col", ...` for a SELECT of `model`'s columns (all, or those of `names`)."""
    return ", ".join(f'{alias}."{f.column}"' for f in columns(model, names))


@functools.cache
def _converters(model, names: tuple[str, ...] | None, vendor: str, alias: str) -> tuple:
    # as the ORM converts what the cursor gives (SQLite's datetimes come naive, its booleans as 0/1)
    connection = connections[alias]
    found = []
    for field in columns(model, names):
        col = field.get_col(model._meta.db_table)
        found.append((col, tuple(connection.ops.get_db_converters(col) + field.get_db_converters(connection))))
    return tuple(found)


def from_row(model, values, names: tuple[str, ...] | None = None, alias: str | None = None):
    """An instance of `model` from the values of its columns (all, or those of `names`; the others
    deferred) as the cursor gave them, converted as the ORM converts them."""
    connection = connections[alias] if alias else default_connection
    converted = []
    for (col, convert), value in zip(_converters(model, names, connection.vendor, connection.alias), values, strict=True):
        for converter in convert:
            value = converter(value, col, connection)
        converted.append(value)
    attnames = [f.attname for f in columns(model, names)]
    return model.from_db(connection.alias, attnames, converted)


def fetch(sql: str, params: list, alias: str | None = None) -> list[tuple]:
    """The rows of one statement, as the cursor gives them."""
    connection = connections[alias] if alias else default_connection
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def fetch_objects(model, sql: str, params: list, names: tuple[str, ...] | None = None) -> list:
    """`model` instances of a statement that selects its columns (all, or those of `names`) in order."""
    return [from_row(model, row, names) for row in fetch(sql, params)]


def ping() -> None:
    """One round trip to the database (the health check's)."""
    fetch("SELECT 1", [])
