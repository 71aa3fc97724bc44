"""A multi-host replica (`nodes: 2`) is one unit of its own jobs, and keeps its hosts for a restart:
in the engine's steps, in the test process, no worker.

- A replica number freed while a node of its removed replica still stops is not given to a new
  replica, and a new replica of that number (another deployment's, say) is never one unit with the
  old node: its end does not stop the new replica.
- Nodes that all fail with an error keep their hosts through the back-off (a TPU replica's slice is
  deleted once all its hosts are idle), and give them back when the replica is not restarted."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from engine import finishing, processing
from engine.replicas import rows
from engine.starting import cluster
from engine.submitted import provision
from instances.models import Instance
from runs.models import Job, Run
from runs.services.submission import submit_run
from runs.transitions import request_stop
from tests.engine.helpers import local_project_fleet
from tests.engine.test_multi_host_keep import TWO_BY_TWO

pytestmark = pytest.mark.django_db(transaction=True)

ONE = TWO_BY_TWO.replace("replicas: 2", "replicas: 1")


def _live(run: Run) -> list[tuple[int, int, int, str]]:
    return [(j.replica_num, j.job_num, j.node_group_rank, j.status)
            for j in Job.objects.filter(run=run, superseded=False).order_by("job_num")]


def _half_stopped(run: Run) -> tuple[Job, Job]:
    """Replica 1 drained: its node 0 has ended, its node 1 still stops."""
    now = timezone.now()
    Job.objects.filter(run=run).update(status="running", ready_at=now, first_ready_at=now)
    head, member = Job.objects.filter(run=run, replica_num=1).order_by("node_group_rank")
    past = now - timedelta(minutes=5)
    Job.objects.filter(pk=head.pk).update(status="terminated", termination_reason="terminated_by_server",
                                          drain_at=past, ready_at=None)
    Job.objects.filter(pk=member.pk).update(status="terminating", termination_reason="terminated_by_server",
                                            drain_at=past)
    return head, member


def test_a_replica_number_is_not_used_again_while_a_node_of_its_old_replica_still_stops(sent):
    fleet = local_project_fleet(size=6)
    run = submit_run(fleet.project, None, {"configuration": TWO_BY_TWO})
    head, member = _half_stopped(run)
    assert processing.process_run(run.pk)  # node 0 let go; the group is one replica short
    assert Job.objects.get(pk=head.pk).superseded
    added = list(Job.objects.filter(run=run, job_num__gt=member.job_num).order_by("job_num"))
    assert [(j.replica_num, j.node_group_rank) for j in added] == [(2, 0), (2, 1)], \
        "number 1 is still held by the node that stops"
    Job.objects.filter(pk=member.pk).update(status="terminated")
    assert processing.process_run(run.pk)
    assert Job.objects.get(pk=member.pk).superseded
    assert all(j.status == "submitted" and j.drain_at is None for j in Job.objects.filter(pk__in=[a.pk for a in added]))


def test_an_old_node_is_not_in_the_unit_of_a_new_replica_of_its_number(sent):
    fleet = local_project_fleet(size=6)
    run = submit_run(fleet.project, None, {"configuration": TWO_BY_TWO})
    head, member = _half_stopped(run)
    assert processing.process_run(run.pk)
    extra = [j for j in Job.objects.filter(run=run, job_num__gt=member.job_num)]
    Job.objects.filter(pk__in=[j.pk for j in extra]).delete()
    # a new replica numbered 1 while the old node 1 still stops (as another deployment's may be)
    run.refresh_from_db()
    new0 = rows.add(run, "0", 1, rows.next_job_num(run, []), "the test's")
    new1 = Job.objects.get(run=run, job_num=new0.job_num + 1)
    current = list(Job.objects.filter(run=run, superseded=False).select_related("run"))
    assert [j.pk for j in cluster.replica_of(new0, current)] == [new0.pk, new1.pk], "the old node is no peer of it"
    assert [j.pk for j in cluster.replica_of(Job.objects.get(pk=member.pk), current)] == [member.pk]
    Job.objects.filter(pk=member.pk).update(status="terminated")
    assert processing.process_run(run.pk)
    assert Job.objects.get(pk=member.pk).superseded
    assert [(j.status, j.drain_at, j.superseded) for j in Job.objects.filter(pk__in=[new0.pk, new1.pk])] == \
        [("submitted", None, False)] * 2, _live(run)


def _fail_both(run: Run) -> list[Job]:
    assert provision.provision_job(Job.objects.get(run=run, node_group_rank=0).pk)
    nodes = list(Job.objects.filter(run=run).order_by("node_group_rank"))
    assert all(j.status == "provisioning" and j.instance_id for j in nodes)
    Job.objects.filter(run=run).update(status="terminating", termination_reason="container_exited_with_error")
    for job in nodes:
        assert finishing.finish_job(job.pk)
    return list(Job.objects.filter(pk__in=[j.pk for j in nodes]).order_by("node_group_rank"))


def _hosts(nodes: list[Job]) -> list[str]:
    return [Instance.objects.get(pk=j.instance_id).status for j in nodes]


def test_nodes_that_all_fail_keep_their_hosts_through_the_back_off_and_restart_on_them(sent):
    fleet = local_project_fleet(size=4)
    run = submit_run(fleet.project, None, {"configuration": ONE})
    failed = _fail_both(run)
    assert all(j.status == "failed" and j.keep_host for j in failed), [(j.status, j.keep_host) for j in failed]
    assert _hosts(failed) == ["busy", "busy"], "nobody (no idle policy) takes a replica's hosts in its back-off"
    assert processing.process_run(run.pk)
    assert _hosts(failed) == ["busy", "busy"] and not any(Job.objects.get(pk=j.pk).superseded for j in failed)
    Job.objects.filter(pk__in=[j.pk for j in failed]).update(status_changed_at=timezone.now() - timedelta(minutes=5))
    assert processing.process_run(run.pk)
    fresh = list(Job.objects.filter(run=run, superseded=False).order_by("node_group_rank"))
    assert [(j.submission_num, j.status, j.instance_id) for j in fresh] == \
        [(1, "provisioning", j.instance_id) for j in failed], "on the same hosts"


def test_a_replica_not_restarted_gives_its_hosts_back(sent):
    fleet = local_project_fleet(size=2)
    run = submit_run(fleet.project, None, {"configuration": ONE.replace("[error, interruption]", "[interruption]")})
    failed = _fail_both(run)
    assert not any(j.keep_host for j in failed) and _hosts(failed) == ["idle", "idle"], "no retry on errors: none kept"

    Instance.objects.filter(fleet=fleet).update(status="idle")
    Job.objects.all().delete()
    run = submit_run(fleet.project, None, {"configuration": ONE.replace("name: mh", "name: mh2")})
    failed = _fail_both(run)
    assert _hosts(failed) == ["busy", "busy"]
    request_stop(Run.objects.get(pk=run.pk))
    for _ in range(3):
        processing.process_run(run.pk)
    assert Run.objects.get(pk=run.pk).status in ("terminated", "done", "failed"), Run.objects.get(pk=run.pk).status
    assert _hosts(failed) == ["idle", "idle"], "the stopped service keeps nothing"
    assert not Job.objects.filter(run=run, keep_host=True).exists()


def test_a_failed_replica_scaled_down_in_its_back_off_is_let_go_with_its_hosts(sent):
    fleet = local_project_fleet(size=4)
    run = submit_run(fleet.project, None, {"configuration": TWO_BY_TWO})
    for job in Job.objects.filter(run=run, node_group_rank=0).order_by("replica_num"):
        assert provision.provision_job(job.pk)
    now = timezone.now()
    Job.objects.filter(run=run, replica_num=0).update(status="running", ready_at=now, first_ready_at=now)
    Job.objects.filter(run=run, replica_num=1).update(status="terminating",
                                                      termination_reason="container_exited_with_error")
    failed = list(Job.objects.filter(run=run, replica_num=1).order_by("node_group_rank"))
    for job in failed:
        assert finishing.finish_job(job.pk)
    assert _hosts(failed) == ["busy", "busy"]
    Run.objects.filter(pk=run.pk).update(desired_replicas={"0": 1})
    assert processing.process_run(run.pk)
    assert all(j.superseded and not j.keep_host for j in Job.objects.filter(pk__in=[j.pk for j in failed]))
    assert _hosts(failed) == ["idle", "idle"], "a replica that is not restarted keeps nothing"
    assert [(r, s) for r, _, _, s in _live(run)] == [(0, "running"), (0, "running")], "the serving one stays"
