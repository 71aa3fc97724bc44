"""What one provisioning step reads of a shared fleet (muster/step_reads.py `kept`): the quotas, the
usage and the fleet's size once for the step's choices, however many runs and questions, while the
check that gives the hosts (`within`, under the fleet's lock) counts what is held afresh."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from instances import shares
from instances.models import FleetShare, Instance
from muster import step_reads
from projects.models import Project
from runs.models import Job, Run
from runs.services.submission import submit_run
from tests.engine.helpers import local_project_fleet

pytestmark = pytest.mark.django_db

ONE = [({}, 1)]


def _holding(fleet, project: Project, host) -> None:
    """A job of `project` on `host` (as placement leaves it)."""
    run = submit_run(fleet.project, None, {"configuration": "type: task\ncommands: [echo]\n"})
    Run.objects.filter(pk=run.pk).update(project=project, fleet=fleet)
    Job.objects.filter(run=run).update(instance=host, fleet=fleet, status="provisioning")
    Instance.objects.filter(pk=host.pk).update(status="busy", holder=project)


def _taking(host, project: Project) -> list:
    """`host` as take_instances leaves it for `within`, in the placement's transaction: busy, the project's."""
    Instance.objects.filter(pk=host.pk).update(status="busy", holder=project)
    return [host]


def test_a_step_reads_a_shared_fleet_once_and_placement_s_check_counts_what_is_held_afresh():
    fleet = local_project_fleet(size=2)
    research = Project.objects.create(name="research")
    FleetShare.objects.create(fleet=fleet, project=fleet.project, hosts=1)
    FleetShare.objects.create(fleet=fleet, project=research, hosts=1)
    first, second = fleet.instances.order_by("index")
    with step_reads.kept():
        assert shares.quota_refusals([fleet], research.pk, ONE) == {}
        with CaptureQueriesContext(connection) as asked_again:
            assert shares.quota_refusals([fleet], research.pk, ONE) == {}
        assert len(asked_again) == 0, "the step's second question is answered from its first read"
        _holding(fleet, research, first)  # research now holds its one host
        # the choice is the step's (stale here: a later check refuses); the hosts' check is not
        assert shares.quota_refusals([fleet], research.pk, ONE) == {}
        assert shares.within(fleet, research.pk, _taking(second, research)) == (
            "quota: project research holds 1 of its 1 hosts of fleet local (borrowing: none) and needs 1")
    assert list(shares.quota_refusals([fleet], research.pk, ONE)) == [fleet.pk], "read afresh once the step is over"


def test_whether_a_run_could_ever_fit_reads_neither_usage_nor_the_fleet_s_size():
    fleet = local_project_fleet(size=2)
    research = Project.objects.create(name="research")
    FleetShare.objects.create(fleet=fleet, project=research, hosts=1, borrow_hosts=1)
    with CaptureQueriesContext(connection) as read:
        assert shares.quota_refusals([fleet], research.pk, [({}, 2)], at_all=True) == {}
        assert list(shares.quota_refusals([fleet], research.pk, [({}, 3)], at_all=True)) == [fleet.pk]
    assert len(read) == 2, [q["sql"] for q in read]  # the shares, once per question


def test_a_step_s_own_take_is_counted_on_what_the_hosts_check_read_under_the_lock_not_on_its_older_read():
    fleet = local_project_fleet(size=3)
    research = Project.objects.create(name="research")
    FleetShare.objects.create(fleet=fleet, project=fleet.project, hosts=1)
    FleetShare.objects.create(fleet=fleet, project=research, hosts=2)
    first, second, third = fleet.instances.order_by("index")
    with step_reads.kept():
        assert shares.usage_of(fleet.pk) == {}
        _holding(fleet, research, first)  # another worker's placement, after the step's first read
        assert shares.within(fleet, research.pk, _taking(second, research)) == ""
        shares.took(fleet.pk, research.pk, [second])
        assert shares.usage_of(fleet.pk)[research.pk]["hosts"] == 2, "the other worker's host and the step's own"
        assert list(shares.quota_refusals([fleet], research.pk, ONE)) == [fleet.pk], "its next run: at its quota"
