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
def _reader(model, names: tuple[str, ...] | None, alias: str, vendor: str) -> tuple[list[str], tuple]:
    """The attnames of the columns, and the converters of those that have any (as the ORM converts
    what the cursor gives: SQLite's datetimes come naive, a JSON column as text)."""
    connection = connections[alias]
    fields = columns(model, names)
    convert = []
    for position, field in enumerate(fields):
        col = field.get_col(model._meta.db_table)
        found = connection.ops.get_db_converters(col) + field.get_db_converters(connection)
        if found:
            convert.append((position, col, tuple(found)))
    return [f.attname for f in fields], tuple(convert)


def from_row(model, values, names: tuple[str, ...] | None = None, alias: str | None = None):
    """An instance of `model` from the values of its columns (all, or those of `names`; the others
    deferred) as the cursor gave them, converted as the ORM converts them."""
    connection = connections[alias] if alias else default_connection
    attnames, convert = _reader(model, names, connection.alias, connection.vendor)
    if convert:
        values = list(values)
        for position, col, converters in convert:
            value = values[position]
            for converter in converters:
                value = converter(value, col, connection)
            values[position] = value
    return model.from_db(connection.alias, attnames, values)


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
