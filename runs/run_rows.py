"""A new run, its jobs and the event that says it was submitted, written together (submit's apply).

On PostgreSQL one data-modifying WITH writes all three: the jobs and the event take the run's id
from the run's INSERT in the same statement, which is atomic on its own, so an apply's write is
one round trip instead of five (BEGIN, three INSERTs, COMMIT) and Django compiles no INSERT. The
values are the ones Django's own INSERT would send (each field's `pre_save` and
`get_db_prep_save`), so the rows are the same (tests/test_run_rows.py). Elsewhere (SQLite), and for
a run of more than ONE_STATEMENT_JOBS jobs, the ORM writes them in the caller's transaction.
"""

from __future__ import annotations

import functools

from django.db import connections, router

from events.models import Event
from runs.models import Job, Run


@functools.cache
def _fields(model) -> list:
    """The columns a new row of `model` is written with: all but its id, and but the run it
    belongs to, which the statement fills in."""
    return [f for f in model._meta.concrete_fields if not f.primary_key and f.attname != "run_id"]


# The statement's text is kept per number of jobs, and a run may have up to 4,096 (task.py's
# DEFAULT_MAX_NODES): kept for every size, the texts of large runs would take hundreds of MB. Past
# this many jobs the ORM writes the run, in the caller's transaction, as before.
ONE_STATEMENT_JOBS = 256


def one_statement(connection, jobs: int) -> bool:
    """Whether `insert` writes a run of `jobs` jobs as one statement (else the caller's transaction)."""
    return connection.vendor == "postgresql" and 0 < jobs <= ONE_STATEMENT_JOBS


@functools.lru_cache(maxsize=ONE_STATEMENT_JOBS)
def _statement(jobs: int) -> str:
    quote = connections[router.db_for_write(Run)].ops.quote_name

    def columns(model, with_run: bool) -> str:
        names = [quote(f.column) for f in _fields(model)]
        return ", ".join([quote("run_id"), *names] if with_run else names)

    def row(model, with_run: bool) -> str:
        marks = ["%s"] * len(_fields(model))
        return "(" + ", ".join(['(SELECT "id" FROM r)', *marks] if with_run else marks) + ")"

    table = lambda model: quote(model._meta.db_table)  # noqa: E731
    return (f"WITH r AS (INSERT INTO {table(Run)} ({columns(Run, False)}) VALUES {row(Run, False)} RETURNING \"id\"), "
            f"j AS (INSERT INTO {table(Job)} ({columns(Job, True)}) VALUES "
            f"{', '.join([row(Job, True)] * jobs)} RETURNING \"id\", {quote('job_num')}), "
            f"e AS (INSERT INTO {table(Event)} ({columns(Event, True)}) VALUES {row(Event, True)} RETURNING \"id\") "
            f"SELECT (SELECT \"id\" FROM r), (SELECT \"id\" FROM e), j.\"id\", j.{quote('job_num')} FROM j")


def _values(obj, connection) -> list:
    # as SQLInsertCompiler: pre_save (auto_now_add sets the attribute too), then the field's prep
    return [f.get_db_prep_save(f.pre_save(obj, True), connection) for f in _fields(type(obj))]


def insert(run: Run, jobs: list[Job], event: Event) -> None:
    """Write the new `run`, its `jobs` and `event` (neither's run set yet), and give each its id.

    Unless `one_statement` says so, the caller holds a transaction (three statements or more)."""
    alias = router.db_for_write(Run)
    connection = connections[alias]
    if not one_statement(connection, len(jobs)):
        insert_with_orm(run, jobs, event)
        return
    params = _values(run, connection)
    for job in jobs:
        params += _values(job, connection)
    params += _values(event, connection)
    with connection.cursor() as cursor:
        cursor.execute(_statement(len(jobs)), params)
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
