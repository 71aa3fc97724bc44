"""Queries the engine runs on every step, turned into SQL once per process instead of once per call.

Django builds a queryset (filters resolved into a WHERE tree) and compiles it (every selected column
quoted, every join laid out) on each call. For the read of a job with its run, host, fleet and host
group that is about 1.5 ms of CPU, against 0.2 ms for PostgreSQL to answer the same SQL: a third of
what a placed job cost a worker (docs/performance.md). A `Select` is written as a queryset like
any other, but built once with markers where its arguments go, compiled once per database, and from
then on only its parameters change. The rows become model instances as every rows module's do
(muster/rows.from_row) and their related rows through select_related's populators, so they are
the objects the queryset itself would have returned.

Arguments are integers (ids) or aware datetimes; a marker is a value no row holds, found back in
the compiled parameters to know where each argument goes. tests/test_compiled_queries.py holds each
`Select` of the engine to its queryset.

`row_update` is the same for the guarded UPDATE of one row that every step's give-back and every
status move makes: written once per shape of its SET and WHERE.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from django.db import connection, connections, router
from django.db.models import Model, QuerySet, sql
from django.db.models.query import ModelIterable, get_related_populators

from muster import rows

# Far below any id a sequence hands out, and dates no row carries: found back in the parameters.
_INT_MARK = -(2 ** 62)
_DATE_MARK = datetime(1901, 2, 3, 4, 5, 6, tzinfo=UTC)


def _markers(kinds: tuple[type, ...]) -> list:
    marks = []
    for i, kind in enumerate(kinds):
        if kind is int:
            marks.append(_INT_MARK - i)
        elif kind is datetime:
            marks.append(_DATE_MARK + timedelta(seconds=i))
        else:
            raise TypeError(f"a compiled query takes int or datetime arguments, not {kind.__name__}")
    return marks


class _Plan:
    """One Select compiled for one database: the SQL, where each argument goes, how a row becomes objects."""

    def __init__(self, queryset: QuerySet, marks: list, kinds: tuple, alias: str) -> None:
        connection = connections[alias]
        compiler = queryset.query.get_compiler(using=alias)
        sql, params = compiler.as_sql()
        adapted = [self._adapt(connection, kind, mark) for kind, mark in zip(kinds, marks, strict=True)]
        self.slots: list[int | None] = [None] * len(params)
        for position, value in enumerate(params):
            for arg, mark in enumerate(adapted):
                if value == mark and type(value) is type(mark):
                    self.slots[position] = arg
        found = sorted({arg for arg in self.slots if arg is not None})
        if found != list(range(len(kinds))):
            raise ValueError(f"compiled query: arguments {sorted(set(range(len(kinds))) - set(found))} are not "
                             f"in its SQL (each must be a plain filter value): {sql}")
        self.sql, self.params, self.kinds = sql, list(params), kinds
        self.model: type[Model] = queryset.model
        select, klass_info = compiler.select, compiler.klass_info
        self.objects = queryset._iterable_class is ModelIterable  # a .values() query is only used as SQL
        if not self.objects:
            return
        if compiler.annotation_col_map:
            raise ValueError("compiled query: annotations are not supported")
        fields = klass_info["select_fields"]
        self.own = slice(fields[0], fields[-1] + 1)
        self.names = tuple(column[0].target.attname for column in select[self.own])
        if [f.attname for f in rows.columns(self.model, self.names)] != list(self.names):
            raise ValueError(f"compiled query: the model's columns are not in its own order: {sql}")
        self.related = get_related_populators(klass_info, select, alias)
        # the model's own columns are converted by muster/rows.from_row, the related rows' here
        self.converters = [(position, found) for position, found in compiler.get_converters(
            [column[0] for column in select]).items() if not self.own.start <= position < self.own.stop]

    @staticmethod
    def _adapt(connection, kind, value):
        # What the compiler put in the parameters for this value (SQLite stores datetimes as text).
        return connection.ops.adapt_datetimefield_value(value) if kind is datetime else value

    def bind(self, alias: str, args: tuple) -> list:
        if len(args) != len(self.kinds):
            raise TypeError(f"compiled query: {len(self.kinds)} arguments expected, {len(args)} given")
        connection = connections[alias]
        adapted = [self._adapt(connection, kind, value) for kind, value in zip(self.kinds, args, strict=True)]
        return [value if slot is None else adapted[slot] for value, slot in zip(self.params, self.slots, strict=True)]

    def rows(self, alias: str, args: tuple) -> list[Model]:
        if not self.objects:
            raise TypeError("a compiled .values() query gives its SQL (Select.statement), not objects")
        connection = connections[alias]
        with connection.cursor() as cursor:
            cursor.execute(self.sql, self.bind(alias, args))
            fetched = cursor.fetchall()
        found = []
        for row in fetched:
            if self.converters:
                row = list(row)
                for position, (convert, expression) in self.converters:
                    value = row[position]
                    for converter in convert:
                        value = converter(value, expression, connection)
                    row[position] = value
            obj = rows.from_row(self.model, row[self.own], self.names, alias)
            for populator in self.related:
                populator.populate(row, obj)
            found.append(obj)
        return found


class Select:
    """`build(*markers)` returns the queryset; `kinds` the type of each argument (int or datetime).

        JOB = Select(lambda pk: Job.objects.select_related("run").filter(pk=pk), int)
        JOB.get(7), JOB.all(7)

    The queryset must not change between calls but for its arguments: no `.filter()` on the result,
    no dates or lists taken from the caller (those are arguments, or constants of the query).
    """

    def __init__(self, build: Callable[..., QuerySet], *kinds: type) -> None:
        self.build, self.kinds = build, kinds
        self._plans: dict[tuple[str, str], _Plan] = {}
        self._model: type[Model] | None = None
        self._lock = threading.Lock()

    def _plan(self, alias: str) -> _Plan:
        key = (alias, connections[alias].vendor)
        plan = self._plans.get(key)
        if plan is None:
            with self._lock:
                plan = self._plans.get(key)
                if plan is None:
                    marks = _markers(self.kinds)
                    plan = self._plans[key] = _Plan(self.build(*marks), marks, self.kinds, alias)
        return plan

    def all(self, *args) -> list[Model]:
        alias = self._alias()
        return self._plan(alias).rows(alias, args)

    def get(self, *args) -> Model:
        """The one row, as `QuerySet.get`: DoesNotExist when there is none, MultipleObjectsReturned when more."""
        alias = self._alias()
        plan = self._plan(alias)
        found = plan.rows(alias, args)
        if not found:
            raise plan.model.DoesNotExist(f"{plan.model.__name__} matching {args} does not exist")
        if len(found) > 1:
            raise plan.model.MultipleObjectsReturned(f"{len(found)} {plan.model.__name__} rows match {args}")
        return found[0]

    def statement(self, *args) -> tuple[str, list]:
        """The SQL and its parameters, to be part of a larger statement."""
        alias = self._alias()
        plan = self._plan(alias)
        return plan.sql, plan.bind(alias, args)

    def _alias(self) -> str:
        if self._model is None:
            self._model = self.build(*_markers(self.kinds)).model
        return router.db_for_read(self._model)


# (model, SET names, WHERE shape, vendor) -> the UPDATE of row_update
_ROW_UPDATES: dict[tuple, str] = {}


def row_update(model: type[Model], pk, where: dict, updates: dict) -> tuple[str, list] | None:
    """`model.objects.filter(pk=pk, **where).update(**updates)` as (sql, params), its SQL written once
    per shape. `where` holds equalities and non-empty `__in` lookups on the model's own columns;
    None for anything else (an expression or a model instance to write, another lookup), which is
    the ORM's to do."""
    if any(hasattr(v, "resolve_expression") or hasattr(v, "prepare_database_save") for v in updates.values()):
        return None
    shape = []
    for key, value in where.items():
        name, _, lookup = key.partition("__")
        if lookup not in ("", "in") or (lookup == "in" and not value) or hasattr(value, "resolve_expression"):
            return None
        shape.append((name, len(value) if lookup else 0))
    meta = model._meta
    names = tuple(updates)
    key = (model, names, tuple(shape), connection.vendor)
    sql = _ROW_UPDATES.get(key)
    if sql is None:
        quote = connection.ops.quote_name
        sets = ", ".join(f"{quote(meta.get_field(n).column)} = %s" for n in names)
        guards = "".join(f" AND {quote(meta.get_field(n).column)} "
                         + (f"IN ({', '.join(['%s'] * count)})" if count else "= %s") for n, count in shape)
        sql = _ROW_UPDATES[key] = f"UPDATE {quote(meta.db_table)} SET {sets} WHERE {quote(meta.pk.column)} = %s{guards}"
    params = [meta.get_field(n).get_db_prep_save(updates[n], connection) for n in names]
    params.append(pk)
    for (n, count), value in zip(shape, where.values(), strict=True):
        field = meta.get_field(n)
        if count:
            params.extend(field.get_db_prep_value(v, connection) for v in value)
        else:
            params.append(field.get_db_prep_value(value, connection))
    return sql, params


def update_of(queryset: QuerySet, updates: dict) -> tuple[str, list]:
    """`queryset.update(**updates)` as (sql, params), compiled by the ORM (expressions and all), to be
    part of a larger statement."""
    query = queryset.query.chain(sql.UpdateQuery)
    query.add_update_values(updates)
    query.annotations = {}  # as QuerySet.update: none in the statement
    statement, params = query.get_compiler(queryset.db).as_sql()
    return statement, list(params)
