"""A host's holder (Instance.holder): the project whose job it is busy with, written by the move that
gives it to a job and cleared by the one that gives it back, so what each project holds of a shared
fleet (instances/rows.held, the quota's check under the fleet's lock) is a count of hosts instead of
an aggregate over jobs. Driven through the engine's steps, in the test process: every count must
equal what the jobs on the hosts say, and a host kept for a restart stays its project's."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.apps import apps
from django.utils import timezone

from engine import finishing, processing
from engine.submitted import provision
from instances import rows
from instances.models import FleetShare, Instance
from projects.models import Project
from runs.choices import JOB_UNFINISHED
from runs.models import Job, Run
from runs.services.submission import submit_run
from runs.transitions import request_stop
from tests.engine.helpers import local_project_fleet
from tests.engine.test_multi_host_keep import TWO_BY_TWO

pytestmark = pytest.mark.django_db(transaction=True)

TASK = "type: task\nname: {name}\nnodes: {nodes}\nfleets: [{fleet}]\ncommands: [sleep 60]\n"


def _by_jobs(fleet_id: int) -> dict[tuple[int, int], tuple[int, int]]:
    """What the unfinished jobs on the fleet's hosts say each project holds (the aggregate `held` was)."""
    hosts: dict[int, set[Instance]] = {}
    for job in Job.objects.filter(status__in=JOB_UNFINISHED, instance__fleet_id=fleet_id).select_related(
            "run", "instance"):
        hosts.setdefault(job.run.project_id, set()).add(job.instance)
    return {(fleet_id, project): (len(held), sum(h.gpu_count for h in held)) for project, held in hosts.items()}


def _end(job: Job) -> None:
    """The job's runner said it exited: finish_job ends it and gives its host back."""
    Job.objects.filter(pk=job.pk).update(status="terminating", termination_reason="done_by_runner")
    assert finishing.finish_job(job.pk)


def test_two_projects_on_a_shared_fleet_each_hold_the_hosts_their_jobs_are_on(sent):
    pool = local_project_fleet(size=4, name="pool")
    main, research = pool.project, Project.objects.create(name="research")
    FleetShare.objects.create(fleet=pool, project=main, hosts=2)
    FleetShare.objects.create(fleet=pool, project=research, hosts=2)
    mine = submit_run(main, None, {"configuration": TASK.format(name="train", nodes=2, fleet=pool.name)})
    # the same run name in the other project: holders are by project, not by name
    theirs = submit_run(research, None, {"configuration": TASK.format(name="train", nodes=1,
                                                                      fleet=f"main/{pool.name}")})
    for run in (mine, theirs):
        assert provision.provision_job(run.current_jobs().get(job_num=0).pk)
    expected = {(pool.pk, main.pk): (2, 0), (pool.pk, research.pk): (1, 0)}
    assert rows.held([pool.pk]) == _by_jobs(pool.pk) == expected
    assert rows.held() == expected, "every fleet's count is the same count"
    holders = {job.instance_id: job.run.project_id for job in Job.objects.filter(instance__isnull=False)}
    assert dict(Instance.objects.filter(holder__isnull=False).values_list("pk", "holder_id")) == holders

    _end(theirs.current_jobs().get())
    assert rows.held([pool.pk]) == _by_jobs(pool.pk) == {(pool.pk, main.pk): (2, 0)}
    idle = Instance.objects.filter(fleet=pool, status="idle")
    assert idle.count() == 2 and not idle.filter(holder__isnull=False).exists(), "a host given back is nobody's"


def test_hosts_kept_for_a_restart_stay_the_project_s_and_a_stop_gives_them_back_to_nobody(sent):
    fleet = local_project_fleet(size=4)
    run = submit_run(fleet.project, None, {"configuration": TWO_BY_TWO.replace("replicas: 2", "replicas: 1")})
    head = run.current_jobs().get(node_group_rank=0)
    assert provision.provision_job(head.pk)
    nodes = list(run.current_jobs().order_by("node_group_rank"))
    hosts = [j.instance_id for j in nodes]
    Job.objects.filter(run=run).update(status="terminating", termination_reason="container_exited_with_error")
    for job in nodes:
        assert finishing.finish_job(job.pk)
    assert all(j.keep_host for j in Job.objects.filter(pk__in=[j.pk for j in nodes]))
    # no job runs on them through the back-off, yet nobody else may count them free
    assert rows.held([fleet.pk]) == {(fleet.pk, fleet.project_id): (2, 0)} and _by_jobs(fleet.pk) == {}
    Job.objects.filter(pk__in=[j.pk for j in nodes]).update(status_changed_at=timezone.now() - timedelta(minutes=5))
    assert processing.process_run(run.pk)
    fresh = list(run.current_jobs().order_by("node_group_rank"))
    assert [j.instance_id for j in fresh] == hosts, "the restart is on the same hosts"
    assert rows.held([fleet.pk]) == _by_jobs(fleet.pk) == {(fleet.pk, fleet.project_id): (2, 0)}

    request_stop(Run.objects.get(pk=run.pk))
    for _ in range(3):
        processing.process_run(run.pk)
    for job in run.current_jobs().exclude(status__in=("terminated", "failed", "done", "aborted")):
        _end(job)
    processing.process_run(run.pk)
    assert rows.held([fleet.pk]) == _by_jobs(fleet.pk) == {}
    assert not Instance.objects.filter(holder__isnull=False).exists()


def test_the_migration_gives_each_host_in_use_the_project_of_the_job_that_holds_it(sent):
    """instances 0008: hosts in use before the column came get their holder from the jobs on them;
    an idle or ended host gets none, whatever its jobs say."""
    migration = __import__("instances.migrations.0008_instance_holder", fromlist=["holders_of_hosts_in_use"])
    pool = local_project_fleet(size=4, name="pool")
    main, research = pool.project, Project.objects.create(name="research")
    FleetShare.objects.create(fleet=pool, project=main, hosts=2)
    FleetShare.objects.create(fleet=pool, project=research, hosts=2)
    earlier = submit_run(main, None, {"configuration": TASK.format(name="e", nodes=1, fleet=pool.name)})
    running = submit_run(research, None, {"configuration": TASK.format(name="a", nodes=1, fleet=f"main/{pool.name}")})
    kept = submit_run(main, None, {"configuration": TASK.format(name="b", nodes=1, fleet=pool.name)})
    given_back = submit_run(main, None, {"configuration": TASK.format(name="c", nodes=1, fleet=pool.name)})
    deleted = submit_run(research, None, {"configuration": TASK.format(name="d", nodes=1, fleet=f"main/{pool.name}")})
    h0, h1, h2, h3 = Instance.objects.filter(fleet=pool).order_by("index")
    Instance.objects.filter(pk__in=[h0.pk, h1.pk]).update(status="busy")
    Instance.objects.filter(pk=h3.pk).update(status="terminated")  # its fleet deleted under a running job
    # h0: an older job of main kept it, the newer one of research runs there now: research's
    Job.objects.filter(run=earlier).update(status="failed", keep_host=True, instance=h0)
    Job.objects.filter(run=running).update(status="running", instance=h0)
    Job.objects.filter(run=kept).update(status="failed", keep_host=True, instance=h1)  # its back-off: main's
    Job.objects.filter(run=given_back).update(status="failed", keep_host=True, instance=h2)  # host idle again
    Job.objects.filter(run=deleted).update(status="running", instance=h3)

    migration.holders_of_hosts_in_use(apps, None)
    assert dict(Instance.objects.filter(holder__isnull=False).values_list("pk", "holder_id")) == \
        {h0.pk: research.pk, h1.pk: main.pk}
