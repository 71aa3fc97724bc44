"""The runs app's hand-written statements: a submit's run, jobs and event written together; the
ends of a run's unstarted jobs with their events; a group's members placed on their hosts with
their events; whether a run is due a derive.

A new run, its jobs and the event that says it was submitted, written together (submit's apply).

On PostgreSQL one data-modifying WITH writes all three: the jobs and the event take the run's id
from the run's INSERT in the same statement, which is atomic on its own, so an apply's write is
one round trip instead of five (BEGIN, three INSERTs, COMMIT) and Django compiles no INSERT. The
values are the ones Django's own INSERT would send (each field's `pre_save` and
`get_db_prep_save`), so the rows are the same (tests/test_run_rows.py). They travel as three JSON
documents (the run, the list of jobs, the event) that `jsonb_populate_record(set)` turns into rows
of the tables' own types: the statement's text is one for every size of run, short, with three
parameters, so psycopg keeps its parsed form, where a placeholder per value (141 for 4 jobs) made
it parse the text and adapt every value again on each apply. Elsewhere (SQLite) the ORM writes
them in the caller's transaction.
"""

from __future__ import annotations

import datetime
import functools
import json
import uuid

from django.db import connection as default_connection
from django.db import connections, models, router
from django.db.models import Exists, OuterRef

from events import rows as event_rows
from events.models import Event
from muster import compiled
from muster.rows import one_statement as with_returning
from runs.choices import JOB_UNFINISHED, RUN_FINISHED, JobStatus
from runs.models import Job, Run


@functools.cache
def _fields(model) -> list:
    """The columns a new row of `model` is written with: all but its id, and but the run it
    belongs to, which the statement fills in."""
    return [f for f in model._meta.concrete_fields if not f.primary_key and f.attname != "run_id"]


def one_statement(connection, jobs: int) -> bool:
    """Whether `insert` writes a run of `jobs` jobs as one statement (else the caller's transaction)."""
    return with_returning(connection) and jobs > 0


@functools.cache
def _statement() -> str:
    quote = connections[router.db_for_write(Run)].ops.quote_name

    def names(model) -> str:
        return ", ".join(quote(f.column) for f in _fields(model))

    def source(model, func: str) -> str:
        # the document's keys are the column names; the table's row type converts each value as
        # the column's input does (a timestamp's ISO text, a jsonb column's nested JSON)
        return f"{func}(NULL::{quote(model._meta.db_table)}, %s::jsonb)"

    pk = {model: quote(model._meta.pk.column) for model in (Run, Job, Event)}
    job_num = quote(Job._meta.get_field("job_num").column)
    run_id = f"(SELECT {pk[Run]} FROM r)"

    def rows(model, func: str, with_run: bool) -> str:
        into = f"{quote(model._meta.get_field('run').column)}, {names(model)}" if with_run else names(model)
        values = f"{run_id}, {names(model)}" if with_run else names(model)
        return f"INSERT INTO {quote(model._meta.db_table)} ({into}) SELECT {values} FROM {source(model, func)}"

    event = event_rows.insert_select({"run": run_id, **{f.attname: quote(f.column) for f in _fields(Event)}},
                                     source(Event, "jsonb_populate_record"), returning=pk[Event])
    return (f'WITH r AS ({rows(Run, "jsonb_populate_record", False)} RETURNING {pk[Run]}), '
            f'j AS ({rows(Job, "jsonb_populate_recordset", True)} RETURNING {pk[Job]}, {job_num}), '
            f'e AS ({event}) '
            f'SELECT {run_id}, (SELECT {pk[Event]} FROM e), j.{pk[Job]}, j.{job_num} FROM j')


def _plain(value):
    """A value the fields' get_db_prep_save gave, as JSON (json.dumps' `default`)."""
    from psycopg.types.json import Jsonb  # here: an embedded (SQLite) server never loads psycopg

    if isinstance(value, Jsonb):  # a JSONField's value: its document, nested as it is (none has an encoder)
        return value.obj
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()  # an aware datetime keeps its offset
    if isinstance(value, uuid.UUID):
        return str(value)
    raise TypeError(f"run_rows cannot write a {type(value).__name__} as JSON")


# A field of exactly these classes whose value is of these types goes as it is: their pre_save only
# reads the attribute and their get_db_prep_save gives the same value back (int(), str(), bool(); a
# JSONField without an encoder wraps the document for psycopg, which the JSON nests instead). None
# is SQL NULL for each. Anything else takes Django's own path.
_AS_IS = {models.IntegerField: (int,), models.BigIntegerField: (int,), models.ForeignKey: (int,),
          models.CharField: (str,), models.TextField: (str,), models.BooleanField: (bool,),
          models.FloatField: (float,), models.JSONField: (dict, list, str, int, float, bool)}


@functools.cache
def _columns(model) -> list[tuple[str, str, tuple, object]]:
    return [(f.column, f.attname, (type(None), *_AS_IS[type(f)]) if type(f) in _AS_IS else (), f)
            for f in _fields(model)]


def _document(obj, connection) -> dict:
    values = obj.__dict__
    doc = {}
    for column, attname, plain, field in _columns(type(obj)):
        value = values.get(attname, field)  # deferred or unset: Django's path reads it
        if type(value) in plain:
            doc[column] = value
        else:  # as SQLInsertCompiler: pre_save (auto_now_add sets the attribute too), then the field's prep
            doc[column] = field.get_db_prep_save(field.pre_save(obj, True), connection)
    return doc


def _json(value) -> str:
    # allow_nan=False: JSON has no NaN, and PostgreSQL would refuse the document anyway
    return json.dumps(value, default=_plain, allow_nan=False, ensure_ascii=False)


def insert(run: Run, jobs: list[Job], event: Event) -> None:
    """Write the new `run`, its `jobs` and `event` (neither's run set yet), and give each its id.

    Unless `one_statement` says so, the caller holds a transaction (three statements or more)."""
    alias = router.db_for_write(Run)
    connection = connections[alias]
    if not one_statement(connection, len(jobs)):
        insert_with_orm(run, jobs, event)
        return
    params = [_json(_document(run, connection)), _json([_document(job, connection) for job in jobs]),
              _json(_document(event, connection))]
    with connection.cursor() as cursor:
        cursor.execute(_statement(), params)
        written = cursor.fetchall()
    run.pk = written[0][0]
    event.pk = written[0][1]
    ids = {job_num: pk for _, _, pk, job_num in written}
    for obj in (run, event, *jobs):
        obj._state.adding, obj._state.db = False, alias
    for job in jobs:
        job.pk = ids[job.job_num]
        job.run = run
    event.run = run


def insert_with_orm(run: Run, jobs: list[Job], event: Event) -> None:
    """The same rows through the ORM, in the caller's transaction."""
    run.save(force_insert=True)
    for job in jobs:
        job.run = run
    Job.objects.bulk_create(jobs)
    event.run = run
    event.save(force_insert=True)


def ends_in_one(connection, jobs: int) -> bool:
    """Whether `end_unstarted` writes the ends of `jobs` unstarted jobs (else: one move_job each)."""
    return with_returning(connection) and jobs > 1


@functools.cache
def _end_unstarted_statement() -> str:
    quote = default_connection.ops.quote_name
    col = {name: quote(Job._meta.get_field(name).column)
           for name in ("id", "status", "status_changed_at", "termination_reason", "end_time", "job_num", "instance")}
    moved = (f"UPDATE {quote(Job._meta.db_table)} SET {col['status']} = %s, {col['status_changed_at']} = %s, "
             f"{col['termination_reason']} = %s, {col['end_time']} = COALESCE({col['end_time']}, %s) "
             f"WHERE {col['id']} = ANY(%s) AND {col['status']} = %s "
             f"RETURNING {col['id']}, {col['job_num']}, {col['instance']}")
    # the UPDATE's RETURNING feeds the events' INSERT, whose RETURNING says which jobs moved
    events = event_rows.insert_select(
        {"project_id": "%s", "subject": f"%s || moved.{col['job_num']}", "message": "%s", "status": "%s",
         "actor": "%s", "run_id": "%s", "job_id": f"moved.{col['id']}", "instance_id": f"moved.{col['instance']}",
         "created": "%s"}, "moved", returning=event_rows.column("job_id"))
    return f"WITH moved AS ({moved}) {events}"


def end_unstarted(run: Run, job_ids: list[int], to: str, reason: str, actor: str, now: datetime.datetime) -> set[int]:
    """PostgreSQL (ends_in_one): the `submitted` jobs of `job_ids` moved to `to` for `reason`, each
    with its event, in one statement however many there are. Returns the ids moved."""
    with default_connection.cursor() as cursor:
        cursor.execute(_end_unstarted_statement(),
                       [to, now, reason, now.timestamp(), job_ids, JobStatus.SUBMITTED,
                        run.project_id, f"job {run.name}/", f"{to} ({reason})", to, actor, run.pk, now])
        return {row[0] for row in cursor.fetchall()}


@functools.cache
def _place_statement() -> str:
    quote = default_connection.ops.quote_name
    col = {name: quote(Job._meta.get_field(name).column)
           for name in ("id", "status", "status_changed_at", "instance", "waiting_master_job")}
    table = quote(Job._meta.db_table)
    # each member given its host, if it still waits for one (a stop may have moved it on)
    moved = (f"UPDATE {table} SET {col['instance']} = v.inst, {col['status']} = %s, {col['waiting_master_job']} = false, "
             f"{col['status_changed_at']} = %s FROM v WHERE {table}.{col['id']} = v.job AND {table}.{col['status']} = %s "
             f"AND {table}.{col['instance']} IS NULL RETURNING {table}.{col['id']}")
    # an event whose `cond` names a member is written only if that member moved (its own, its host's)
    events = event_rows.insert_select(
        {"project_id": "%s", "subject": "e.subject", "message": "e.message", "status": "e.status", "actor": "%s",
         "run_id": "e.run_id", "job_id": "e.job_id", "instance_id": "e.instance_id", "created": "%s"},
        f"e WHERE e.cond IS NULL OR e.cond IN (SELECT {col['id']} FROM moved)")
    return (f"WITH v AS (SELECT * FROM unnest(%s::bigint[], %s::bigint[]) AS v(job, inst)), moved AS ({moved}), "
            "e AS (SELECT * FROM unnest(%s::bigint[], %s::text[], %s::text[], %s::text[], %s::bigint[], %s::bigint[], "
            f"%s::bigint[]) WITH ORDINALITY AS e(cond, subject, message, status, run_id, job_id, instance_id, n)), "
            f"written AS ({events} ORDER BY e.n) SELECT {col['id']} FROM moved")


def place(project_id: int, pairs: dict[int, int], to: str, frm: str, now: datetime.datetime,
          events: list[tuple[int | None, dict]]) -> set[int]:
    """PostgreSQL (with_returning): each job of `pairs` (job pk -> instance pk) still `frm` with no
    host moved to `to` on its instance, and `events` ((member pk or None, event entry), in order:
    with a member pk, written only if that member moved), in one statement however large the
    group. Returns the pks moved."""
    columns = list(zip(*[(cond, e["subject"], e["message"], e.get("status", ""), e.get("run_id"), e.get("job_id"),
                          e.get("instance_id")) for cond, e in events], strict=True)) if events else [()] * 7
    with default_connection.cursor() as cursor:
        cursor.execute(_place_statement(), [list(pairs), list(pairs.values()), to, now, frm,
                                            *[list(c) for c in columns], project_id, "server", now])
        return {row[0] for row in cursor.fetchall()}


# the run, if it is still unfinished and none of its current jobs is: compiled once (muster/compiled.py)
_DERIVE_DUE = compiled.Select(lambda run_id: Run.objects.filter(pk=run_id).exclude(status__in=RUN_FINISHED).exclude(
    Exists(Job.objects.filter(run_id=OuterRef("pk"), superseded=False, status__in=JOB_UNFINISHED))).values("pk"), int)


def derive_due(run_id: int) -> bool:
    """Whether every current job of the run has ended while the run itself has not: one short read."""
    sql, params = _DERIVE_DUE.statement(run_id)
    with connections[router.db_for_read(Job)].cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone() is not None
