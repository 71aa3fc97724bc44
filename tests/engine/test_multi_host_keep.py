"""A service's multi-host replicas (`nodes: 2`) in the engine's steps, in the test process, no
worker: placed all or nothing by node 0, removed whole, restarted as one (rows in, rows out)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from engine import processing
from engine.submitted import provision
from instances.models import Instance
from runs.models import Job, Run
from runs.services.submission import submit_run
from tests.engine.helpers import local_project_fleet

pytestmark = pytest.mark.django_db(transaction=True)

NO_RETRY = """type: service
name: mh
port: 8000
nodes: 2
replicas: 2
commands:
  - python3 -m http.server 8000
"""
TWO_BY_TWO = NO_RETRY + "retry:\n  on_events: [error, interruption]\n  duration: 1h\n"


def _unit(run: Run, replica: int) -> list[Job]:
    return list(Job.objects.filter(run=run, superseded=False, replica_num=replica).order_by("node_group_rank"))


def test_node_0_places_its_replica_all_or_nothing(sent):
    fleet = local_project_fleet(size=3)
    run = submit_run(fleet.project, None, {"configuration": NO_RETRY})
    jobs = list(Job.objects.filter(run=run).order_by("job_num"))
    assert [(j.replica_num, j.node_group_rank, j.waiting_master_job) for j in jobs] == \
        [(0, 0, False), (0, 1, True), (1, 0, False), (1, 1, True)]
    assert provision.provision_job(jobs[0].pk)
    head, member = _unit(run, 0)
    assert head.status == member.status == "provisioning" and head.instance_id != member.instance_id
    assert member.fleet_id == head.fleet_id == fleet.pk
    assert provision.provision_job(jobs[2].pk)
    head1, member1 = _unit(run, 1)
    assert head1.termination_reason == "failed_to_start_due_to_no_capacity", head1
    assert "no 2 idle hosts fit it (nodes: 2) in one fleet" in head1.termination_message
    assert member1.instance_id is None
    assert Instance.objects.filter(fleet=fleet, status="idle").count() == 1, "nothing taken for the short replica"


def test_scale_down_removes_a_replica_with_all_its_nodes(sent):
    fleet = local_project_fleet(size=1)
    run = submit_run(fleet.project, None, {"configuration": TWO_BY_TWO})
    Run.objects.filter(pk=run.pk).update(desired_replicas={"0": 1})
    assert processing.process_run(run.pk)
    assert all(j.drain_at is None and j.status == "submitted" for j in _unit(run, 0))
    removed = list(Job.objects.filter(run=run, replica_num=1))
    assert len(removed) == 2 and all(j.drain_at is not None and j.status == "terminated" for j in removed), \
        [(j.job_num, j.status, j.drain_at) for j in removed]
    assert processing.process_run(run.pk)
    assert all(j.superseded for j in Job.objects.filter(run=run, replica_num=1))
    assert Job.objects.filter(run=run, superseded=False).count() == 2, "the removed replica is not replaced"


def test_a_lost_node_stops_its_replica_which_restarts_as_one_on_new_hosts(sent):
    fleet = local_project_fleet(size=4)
    run = submit_run(fleet.project, None, {"configuration": TWO_BY_TWO})
    for job in Job.objects.filter(run=run, node_group_rank=0):
        assert provision.provision_job(job.pk)
    head, member = _unit(run, 0)
    Job.objects.filter(pk=member.pk).update(status="terminated", termination_reason="instance_unreachable")
    assert processing.process_run(run.pk)
    head.refresh_from_db()
    assert head.termination_reason == "terminated_by_server" and "restarts as one" in head.termination_message
    assert not head.keep_host, "an interruption moves the replica: its hosts are not kept"
    assert all(j.status == "provisioning" for j in _unit(run, 1)), "the other replica is not touched"
    # node 0 has ended too (its stop is finish_job's): after the back-off both come back together
    past = timezone.now() - timedelta(minutes=5)
    Job.objects.filter(pk__in=[head.pk, member.pk]).update(status="terminated", status_changed_at=past)
    assert processing.process_run(run.pk)
    fresh = _unit(run, 0)
    assert [(j.job_num, j.submission_num, j.status, j.waiting_master_job) for j in fresh] == \
        [(head.job_num, 1, "submitted", False), (member.job_num, 1, "submitted", True)], fresh
    assert Job.objects.filter(pk__in=[head.pk, member.pk], superseded=True).count() == 2
    assert ("provision_job", fresh[0].pk) in sent.names(), sent.messages


def test_a_rolling_update_adds_a_whole_replica_then_removes_an_old_one_whole(sent):
    fleet = local_project_fleet(size=4)
    one = TWO_BY_TWO.replace("replicas: 2", "replicas: 1")
    run = submit_run(fleet.project, None, {"configuration": one})
    now = timezone.now()
    Job.objects.filter(run=run).update(status="running", ready_at=now, first_ready_at=now)
    submit_run(fleet.project, None, {"configuration": one.replace("http.server 8000", "http.server 8000 --bind 0.0.0.0"),
                                     "update": True})
    assert processing.process_run(run.pk)
    new = list(Job.objects.filter(run=run, deployment_num=1).order_by("job_num"))
    assert [(j.job_num, j.replica_num, j.node_group_rank, j.waiting_master_job) for j in new] == \
        [(2, 1, 0, False), (3, 1, 1, True)], "the surge is one whole replica, numbered after the old one's jobs"
    assert all(j.drain_at is None for j in _unit(run, 0)), "the old replica serves until the new one is ready"
    Job.objects.filter(pk__in=[j.pk for j in new]).update(status="running", ready_at=now, first_ready_at=now)
    assert processing.process_run(run.pk)
    old = _unit(run, 0)
    assert all(j.drain_at is not None for j in old), [(j.node_group_rank, j.drain_at) for j in old]
    assert all(j.drain_at is None for j in _unit(run, 1))
