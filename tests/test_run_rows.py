"""runs/rows.py: a submit's run, jobs and event written as one statement on PostgreSQL must be
the rows the ORM writes, all or nothing, and the submit around it must keep its name-clash retry."""

from __future__ import annotations

from contextlib import nullcontext

import pytest
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from events.models import Event
from projects.models import Project
from runs import rows as run_rows
from runs.job_rows import new_jobs
from runs.models import Job, Run
from runs.services import submission
from runs.services.submission import submit_run
from tests.engine.helpers import local_project_fleet

pytestmark = pytest.mark.django_db(transaction=True)
postgresql_only = pytest.mark.skipif(connection.vendor != "postgresql", reason="the one-statement form is PostgreSQL's")

TASK = "type: task\nnodes: 3\ncommands: [echo]\n"
SPECS = [{"job_num": n, "node_group_name": "0", "node_group_index": 0, "node_group_rank": n,
          "resources": {"cpu": {"min": 1}}} for n in range(3)]
# what differs between two writes of the same values: the row's identity and when it was written
VARYING = {"id", "run_id", "uuid", "name", "subject", "submitted_at", "updated", "created", "status_changed_at"}


def _new(project: Project, name: str) -> tuple[Run, list[Job], Event]:
    run = Run(project=project, name=name, configuration={"type": "task", "nodes": 3}, submitted_text=TASK,
              status="submitted")
    return run, new_jobs(run, SPECS, 0), Event(project_id=project.pk, subject=f"run {name}", message="submitted",
                                               status="submitted", actor="api")


def _row(obj) -> dict:
    fresh = type(obj).objects.get(pk=obj.pk)  # written, and found by the id it was given
    return {f.attname: getattr(fresh, f.attname) for f in fresh._meta.concrete_fields if f.attname not in VARYING}


@postgresql_only
def test_the_one_statement_write_gives_the_rows_the_orm_gives():
    project = Project.objects.create(name="rows")
    one = _new(project, "one")
    with CaptureQueriesContext(connection) as q:
        run_rows.insert(*one)
    assert [s["sql"][:18] for s in q] == ["WITH r AS (INSERT "], [s["sql"][:60] for s in q]
    other = _new(project, "other")
    with transaction.atomic():
        run_rows.insert_with_orm(*other)
    (run, jobs, event), (orm_run, orm_jobs, orm_event) = one, other
    assert _row(run) == _row(orm_run)
    assert [_row(j) for j in jobs] == [_row(j) for j in orm_jobs]
    assert _row(event) == _row(orm_event)
    # each object knows its row, its run, and the times the row holds
    assert [j.run_id for j in jobs] == [run.pk] * 3 and event.run_id == run.pk
    assert sorted(Job.objects.filter(run=run).values_list("pk", "job_num")) == sorted((j.pk, j.job_num) for j in jobs)
    assert Run.objects.get(pk=run.pk).submitted_at == run.submitted_at
    assert abs((run.submitted_at - timezone.now()).total_seconds()) < 60
    assert not run._state.adding and all(not j._state.adding for j in jobs)


@postgresql_only
def test_a_clash_of_names_writes_nothing_at_all():
    project = Project.objects.create(name="clash")
    run_rows.insert(*_new(project, "same"))
    counts = (Run.objects.count(), Job.objects.count(), Event.objects.count())
    with pytest.raises(IntegrityError):
        run_rows.insert(*_new(project, "same"))
    assert (Run.objects.count(), Job.objects.count(), Event.objects.count()) == counts, "no job or event left"
    # another tenant's run of the same name is no clash
    run_rows.insert(*_new(Project.objects.create(name="tenant-b"), "same"))
    assert Run.objects.filter(name="same").count() == 2


@postgresql_only
def test_a_generated_name_submit_is_one_write_without_a_transaction():
    fleet = local_project_fleet(size=3, name="one-write")
    with CaptureQueriesContext(connection) as q:
        run = submit_run(fleet.project, None, {"configuration": TASK})
    writes = [s["sql"] for s in q if not s["sql"].startswith("SELECT")]
    assert len(writes) == 1 and writes[0].startswith("WITH r AS (INSERT"), writes
    assert [j.job_num for j in run.submitted_jobs] == [0, 1, 2]
    assert list(run.current_jobs().values_list("status", "waiting_master_job")) == [
        ("submitted", False), ("submitted", True), ("submitted", True)]
    assert Event.objects.filter(run=run, message="submitted with 3 jobs").count() == 1


@pytest.mark.parametrize("in_callers_transaction", [False, True])
def test_a_generated_name_that_clashes_is_drawn_again(monkeypatch, in_callers_transaction):
    fleet = local_project_fleet(size=3, name="redraw")
    taken = submit_run(fleet.project, None, {"configuration": TASK}).name
    names = iter([taken, "run-fresh0"])
    monkeypatch.setattr(submission, "_generated_name", lambda: next(names))
    with transaction.atomic() if in_callers_transaction else nullcontext():
        run = submit_run(fleet.project, None, {"configuration": TASK})
    assert run.name == "run-fresh0"
    assert Run.objects.filter(project=fleet.project).count() == 2
    assert Job.objects.filter(run__project=fleet.project).count() == 6, "the clash left no job behind"


@postgresql_only
def test_a_large_run_is_one_statement_of_the_same_text():
    fleet = local_project_fleet(size=3, name="large")
    texts = set()
    for nodes in (2, 300):
        with CaptureQueriesContext(connection) as q:
            run = submit_run(fleet.project, None, {"configuration": f"type: task\nnodes: {nodes}\ncommands: [echo]\n"})
        writes = [s["sql"] for s in q if not s["sql"].startswith("SELECT")]
        assert len(writes) == 1 and writes[0].startswith("WITH r AS (INSERT"), writes
        texts.add(run_rows._statement())
        assert Job.objects.filter(run=run).count() == nodes
        assert sorted(j.job_num for j in run.submitted_jobs) == list(range(nodes))
        assert sorted(Job.objects.filter(run=run).values_list("pk", flat=True)) == sorted(
            j.pk for j in run.submitted_jobs)
    assert len(texts) == 1, "one statement text for every size: nothing kept per size"


# values whose JSON form differs from their SQL literal: quotes, backslashes, non-ASCII, a JSON
# string and a JSON list in jsonb columns, floats, times with and without microseconds
AWKWARD_TEXT = "it's \"quoted\" \\ back\\slash\t tab, ünïcödé, 日本, 🚀, $1 %s %(x)s {{ x }}"


@postgresql_only
def test_awkward_values_are_written_as_the_orm_writes_them():
    project = Project.objects.create(name="awkward")
    written, retry_at, check_at = [], timezone.now().replace(microsecond=0), timezone.now()
    for name in ("one", "orm"):
        run, jobs, event = _new(project, name)
        run.configuration = {"type": "task", "env": {"A": AWKWARD_TEXT}, "nested": [1, 2.5, None, True, {"k": []}]}
        run.submitted_text = AWKWARD_TEXT
        run.termination_message = AWKWARD_TEXT
        run.next_retry_at = retry_at
        run.restarts = {"0": 2}
        for job in jobs:
            job.spec = {**job.spec, "commands": [AWKWARD_TEXT]}
            job.probes = ["a", AWKWARD_TEXT]
            job.termination_message = AWKWARD_TEXT
            job.start_time, job.end_time = 1733400000.123456, 1e-7
            job.next_check_at = check_at
            job.waiting_for = AWKWARD_TEXT[:50]
        event.message = AWKWARD_TEXT
        if name == "one":
            run_rows.insert(run, jobs, event)
        else:
            with transaction.atomic():
                run_rows.insert_with_orm(run, jobs, event)
        written.append((run, jobs, event))
    (run, jobs, event), (orm_run, orm_jobs, orm_event) = written
    assert _row(run) == _row(orm_run)
    assert _row(run)["configuration"]["env"]["A"] == AWKWARD_TEXT
    assert [_row(j) for j in jobs] == [_row(j) for j in orm_jobs]
    assert _row(event) == _row(orm_event)
    assert Run.objects.get(pk=run.pk).next_retry_at == retry_at
    assert [Job.objects.get(pk=j.pk).next_check_at for j in jobs] == [check_at] * len(jobs)


def test_no_json_column_of_the_three_tables_has_an_encoder_the_one_statement_would_skip():
    from django.db.models import JSONField

    for model in (Run, Job, Event):
        for field in model._meta.concrete_fields:
            if isinstance(field, JSONField):
                assert field.encoder is None, f"{model.__name__}.{field.name}: run_rows._plain nests the value as is"
