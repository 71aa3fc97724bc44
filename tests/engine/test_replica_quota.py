"""A service's replicas on a shared fleet hold the project's quota when they are placed at once:
the replica's choice of fleet reads the usage its step read (instances/shares.py quota_refusals),
so the hosts are taken with the fleet's row locked and the quota asked again under the lock
(`within`), as a task's gang is (engine/submitted/replica_placement.py)."""

from __future__ import annotations

import pytest

from engine.submitted import provision
from instances import shares
from instances.models import FleetShare, Instance
from projects.models import Project
from runs.models import Job
from runs.services.submission import submit_run
from tests.engine.helpers import local_project_fleet

pytestmark = pytest.mark.django_db(transaction=True)

SERVICE = ("type: service\nname: svc\nreplicas: 2\nport: 8000\ncommands: [sleep 60]\nfleets: [{fleet}]\n"
           "retry: {{on_events: [no-capacity], duration: 1h}}\n")


def test_two_replicas_placed_on_a_stale_read_of_the_usage_still_hold_the_project_s_quota(sent, monkeypatch):
    pool = local_project_fleet(size=3, name="pool")
    research = Project.objects.create(name="research")
    FleetShare.objects.create(fleet=pool, project=pool.project, hosts=1)
    FleetShare.objects.create(fleet=pool, project=research, hosts=2)
    run = submit_run(pool.project, None, {"configuration": SERVICE.format(fleet=pool.name)})
    replicas = list(run.current_jobs().order_by("job_num"))
    assert len(replicas) == 2
    # each replica's step chose the fleet with a read from before the other's placement: both pass
    monkeypatch.setattr(shares, "quota_refusals", lambda *args, **kwargs: {})
    for replica in replicas:
        provision.provision_job(replica.pk)
    on_hosts = Job.objects.filter(pk__in=[r.pk for r in replicas], instance__isnull=False)
    assert on_hosts.count() == 1, "the project's quota is 1 host of the shared fleet, and nothing is borrowable"
    waiting = Job.objects.get(pk__in=[r.pk for r in replicas], instance__isnull=True)
    assert waiting.status == "submitted" and waiting.waiting_for.startswith("a free host: quota: project main holds 1"), \
        waiting.waiting_for
    assert Instance.objects.filter(fleet=pool, status="idle").count() == 2, "the refused take left its host idle"


def _two_groups_placed(pool, second_group: str) -> Job:
    """A run of groups `a` and `second_group` (one node each) placed by job 0's gang; the second
    group's job as it is now."""
    run = submit_run(pool.project, None, {"configuration": (
        f"type: task\nname: two\nfleets: [{pool.name}]\n"
        f"groups:\n  - {{name: a, nodes: 1, commands: [sleep 60]}}\n"
        f"  - {{name: {second_group}, nodes: 1, commands: [sleep 60]}}\n")})
    first, second = run.current_jobs().order_by("job_num")
    provision.provision_job(first.pk)
    second.refresh_from_db()
    return second


def _placed_again(job: Job, host_status: str, **host) -> None:
    """The job's group to be placed again: its host left as `host_status`, the job waiting for a host."""
    Instance.objects.filter(pk=job.instance_id).update(status=host_status, **host)
    Job.objects.filter(pk=job.pk).update(status="submitted", instance=None, waiting_master_job=False)


def test_a_group_placed_again_on_a_shared_fleet_holds_the_project_s_quota(sent):
    """A later group master (its group placed again, engine/submitted/provision.py `_take_group`)
    takes its hosts as job 0's gang does: past the project's quota it ends for want of capacity."""
    pool = local_project_fleet(size=4, name="pool")
    FleetShare.objects.create(fleet=pool, project=pool.project, hosts=2)
    FleetShare.objects.create(fleet=pool, project=Project.objects.create(name="research"), hosts=2)
    second = _two_groups_placed(pool, "b")
    assert second.instance_id is not None, "job 0's gang placed both groups: the project's 2 hosts"
    # group b placed again (its host went back), while another run of the project took a host
    _placed_again(second, "idle")
    other = submit_run(pool.project, None, {"configuration": "type: task\nname: other\ncommands: [sleep 60]\n"})
    host = Instance.objects.filter(fleet=pool, status="idle").order_by("-index").first()
    Instance.objects.filter(pk=host.pk).update(status="busy", holder=pool.project)
    Job.objects.filter(run=other).update(status="running", instance=host, fleet=pool)
    provision.provision_job(second.pk)
    second.refresh_from_db()
    assert second.instance_id is None and second.status in ("terminating", "failed"), second.status
    assert second.termination_message.startswith("quota: project main holds 2 of its 2 hosts"), \
        second.termination_message
    assert Instance.objects.filter(fleet=pool, status="idle").count() == 2


def test_a_group_named_quota_short_of_hosts_is_told_as_short_of_hosts_not_as_a_quota(sent):
    """A quota's refusal is told by its type (instances/shares.py `Refusal`), not by its words: a group
    may be named `quota`, and its "short of idle hosts" line then starts like a refusal's."""
    pool = local_project_fleet(size=2, name="pool")
    second = _two_groups_placed(pool, "quota")
    assert second.instance_id is not None
    # group `quota` placed again (its host went back) while something else took that host
    _placed_again(second, "busy", holder=None)
    provision.provision_job(second.pk)
    second.refresh_from_db()
    assert second.termination_message == "no 1 idle instances of fleet pool fit quota", second.termination_message
