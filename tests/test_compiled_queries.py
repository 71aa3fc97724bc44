"""muster/compiled.py: a query compiled once must answer what its queryset answers, every call,
with the related rows already there; and the engine's compiled reads are their querysets."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from engine import finishing
from engine.starting import advance
from instances.models import Instance, InstanceGroup
from muster import compiled
from runs.models import Job
from runs.services.submission import submit_run
from tests.engine.helpers import local_project_fleet

pytestmark = pytest.mark.django_db


def _values(obj, paths: tuple[str, ...]) -> dict:
    """Every concrete field of obj and of each related object along `paths` ("instance__group")."""
    seen = {"": {f.attname: getattr(obj, f.attname) for f in obj._meta.concrete_fields}}
    for path in paths:
        target = obj
        for name in path.split("__"):
            target = getattr(target, name) if target is not None else None
        seen[path] = None if target is None else {f.attname: getattr(target, f.attname)
                                                  for f in target._meta.concrete_fields}
    return seen


def _placed_run(name: str, nodes: int = 3, grouped: bool = True):
    """A run whose jobs sit on hosts of one fleet, the first host in an instance group, the last job
    on none (as a job not yet placed)."""
    fleet = local_project_fleet(size=nodes, name=f"fleet-{name}")
    run = submit_run(fleet.project, None, {"configuration": f"type: task\nname: {name}\nnodes: {nodes}\n"
                                                            "commands: [echo]\n"})
    hosts = list(fleet.instances.order_by("index"))
    if grouped:
        group = InstanceGroup.objects.create(project=fleet.project, fleet=fleet, name=f"{name}-g", kind="cluster")
        Instance.objects.filter(pk=hosts[0].pk).update(group=group)
    jobs = list(run.current_jobs())
    for job, host in zip(jobs[:-1], hosts, strict=False):
        Job.objects.filter(pk=job.pk).update(status="provisioning", instance=host)
    return run, jobs


@pytest.mark.parametrize("select, queryset, paths", [
    (advance._JOB, lambda pk: Job.objects.select_related("run", "instance", "instance__fleet", "instance__group")
     .filter(pk=pk), ("run", "instance", "instance__fleet", "instance__group")),
    (finishing._JOB, lambda pk: Job.objects.select_related("run", "run__project", "instance", "instance__fleet")
     .filter(pk=pk), ("run", "run__project", "instance", "instance__fleet")),
])
def test_an_engine_job_read_is_its_queryset_with_the_related_rows_in_hand(select, queryset, paths):
    run, jobs = _placed_run("reads")
    for job in jobs:  # grouped host, plain host, no host at all
        expected = queryset(job.pk).get()
        got = select.get(job.pk)
        with CaptureQueriesContext(connection) as q:
            assert _values(got, paths) == _values(expected, paths)
        assert len(q) == 0, "select_related's rows come with the one read"


def test_the_peers_read_is_the_runs_current_jobs_in_rank_order():
    run, jobs = _placed_run("peers", nodes=4)
    other, _ = _placed_run("peers-b", nodes=2)
    Job.objects.filter(pk=jobs[1].pk).update(superseded=True)  # a node given a new submission
    expected = list(run.current_jobs().select_related("instance", "instance__group"))
    got = advance._PEERS.all(run.pk)
    assert [j.pk for j in got] == [j.pk for j in expected] and len(got) == 3
    for g, e in zip(got, expected, strict=True):
        assert _values(g, ("instance", "instance__group")) == _values(e, ("instance", "instance__group"))
    assert advance._PEERS.all(other.pk) and not advance._PEERS.all(-1)


def test_a_missing_row_is_does_not_exist_and_two_rows_are_multiple_objects():
    with pytest.raises(Job.DoesNotExist):
        advance._JOB.get(10 ** 9)
    run, jobs = _placed_run("many", nodes=2, grouped=False)
    by_run = compiled.Select(lambda run_id: Job.objects.filter(run_id=run_id), int)
    with pytest.raises(Job.MultipleObjectsReturned):
        by_run.get(run.pk)


def test_arguments_change_each_call_and_a_datetime_argument_is_bound_as_the_database_wants_it():
    run, jobs = _placed_run("dates", nodes=2, grouped=False)
    now = timezone.now()
    Job.objects.filter(pk=jobs[0].pk).update(status_changed_at=now - timedelta(minutes=5))
    Job.objects.filter(pk=jobs[1].pk).update(status_changed_at=now)
    older = compiled.Select(lambda run_id, before: Job.objects.filter(run_id=run_id, status_changed_at__lt=before)
                            .order_by("job_num"), int, type(now))
    assert [j.pk for j in older.all(run.pk, now - timedelta(minutes=1))] == [jobs[0].pk]
    assert [j.pk for j in older.all(run.pk, now + timedelta(minutes=1))] == [j.pk for j in jobs]
    assert older.all(run.pk + 1000, now + timedelta(minutes=1)) == []
    # the JSON and datetime columns come back converted, as the ORM gives them
    got = older.all(run.pk, now + timedelta(minutes=1))[0]
    assert got.spec == Job.objects.get(pk=jobs[0].pk).spec and got.status_changed_at.tzinfo is not None


def test_an_argument_the_query_does_not_use_is_refused_when_compiled():
    unused = compiled.Select(lambda pk: Job.objects.filter(pk__gt=0), int)
    with pytest.raises(ValueError, match="not in its SQL"):
        unused.all(1)
    with pytest.raises(TypeError, match="2 arguments expected"):
        compiled.Select(lambda a, b: Job.objects.filter(pk=a, run_id=b), int, int).all(1)


def test_the_provisioning_read_is_its_queryset_with_the_related_rows_in_hand():
    from engine.submitted import provision

    run, jobs = _placed_run("provision")
    paths = ("run", "run__project", "run__fleet", "run__user", "instance", "fleet")
    for job in jobs:
        expected = Job.objects.select_related(*paths).get(pk=job.pk)
        got = provision._JOB.get(job.pk)
        with CaptureQueriesContext(connection) as q:
            assert _values(got, paths) == _values(expected, paths)
        assert len(q) == 0


def test_the_derives_reads_are_the_run_with_its_project_and_its_current_jobs():
    from engine import processing

    run, jobs = _placed_run("derive", nodes=3, grouped=False)
    Job.objects.filter(pk=jobs[2].pk).update(superseded=True)
    got = processing._RUN.get(run.pk)
    expected = type(run).objects.select_related("project").get(pk=run.pk)
    with CaptureQueriesContext(connection) as q:
        assert _values(got, ("project",)) == _values(expected, ("project",))
    assert len(q) == 0
    assert [_values(j, ()) for j in processing._JOBS.all(run.pk)] == [_values(j, ()) for j in run.current_jobs()]


@pytest.mark.parametrize("where, moves", [
    ({"status__in": ("provisioning",)}, True),
    ({"status__in": ("provisioning", "pulling")}, True),
    ({"status__in": ("running",)}, False),  # moved on: nothing written, no event
    ({"status__in": ("provisioning",), "lease_token": "mine"}, True),
    ({"status__in": ("provisioning",), "lease_token": "theirs"}, False),
])
def test_a_row_move_written_once_is_the_orms_update_and_its_event(where, moves):
    """events.services.update_row_and_record against update_and_record, the ORM form it stands for:
    the same row written the same way, the same event, on every shape of guard."""
    from events.models import Event
    from events.services import update_and_record, update_row_and_record

    run, jobs = _placed_run("rowmove", nodes=3, grouped=False)
    first, second = jobs[0], jobs[1]
    Job.objects.filter(pk__in=[first.pk, second.pk]).update(lease_token="mine")
    now = timezone.now()
    updates = {"status": "running", "status_changed_at": now, "lease_until": None, "lease_token": "",
               "start_time": 12.5, "ready_at": now}
    event = {"status": "running", "run_id": run.pk, "job_id": None, "instance_id": None}
    before = Event.objects.count()
    written = update_row_and_record(Job, first.pk, where, dict(updates), run.project_id, "job x/0", "moved",
                                    **{**event, "job_id": first.pk})
    ormed = update_and_record(Job.objects.filter(pk=second.pk, **where), dict(updates), run.project_id, "job x/1",
                              "moved", **{**event, "job_id": second.pk})
    assert written == ormed == (1 if moves else 0)
    fields = [*updates, "lease_until", "lease_token"]
    a, b = Job.objects.values(*fields).get(pk=first.pk), Job.objects.values(*fields).get(pk=second.pk)
    if moves:
        assert a == b and a["status"] == "running" and a["lease_token"] == ""
    else:
        assert (a["status"], a["lease_token"]) == (b["status"], b["lease_token"]) == ("provisioning", "mine")
    events = list(Event.objects.filter(pk__gt=0).order_by("-id").values(
        "project_id", "subject", "message", "status", "actor", "run_id", "instance_id")[:Event.objects.count() - before])
    assert len(events) == (2 if moves else 0)
    if moves:
        assert events[0]["subject"] == "job x/1" and events[1]["subject"] == "job x/0"
        assert {k: v for k, v in events[0].items() if k != "subject"} == \
            {k: v for k, v in events[1].items() if k != "subject"}


