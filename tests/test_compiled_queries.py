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
