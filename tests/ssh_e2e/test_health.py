"""The sweep's look at idle SSH hosts: a host that goes away is marked unreachable, and back again."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from engine.ssh_health import check_ssh_hosts
from events.models import Event
from instances.models import Instance
from instances.rows import free_instances
from tests.ssh_e2e.helpers import fleet_configuration, needs_netns, registered_fleet

pytestmark = needs_netns


@pytest.fixture
def fleet(ssh_hosts, project, settings):
    settings.MUSTER = {**settings.MUSTER, "SSH_HEALTH_TIMEOUT": 3}
    pool = ssh_hosts(2, mode="netns")
    return pool, registered_fleet(project, {"configuration": fleet_configuration(pool)})


def age(fleet, seconds: float = 60) -> None:
    """Pretend nobody has talked to the hosts for a while and any earlier check's lease is over."""
    fleet.instances.update(last_seen=timezone.now() - timedelta(seconds=seconds), lease_until=None)


def test_hosts_seen_recently_are_not_checked(fleet):
    _pool, fleet = fleet
    assert check_ssh_hosts() == 0, "registration has just seen every host"


def test_a_host_whose_sshd_is_gone_is_marked_unreachable_and_left_out_of_placement(fleet):
    pool, fleet = fleet
    pool[1].stop_sshd()
    pool[1].kill_processes()
    age(fleet)
    assert check_ssh_hosts() == 2
    up, down = fleet.instances.order_by("index")
    assert not up.unreachable and up.last_seen > timezone.now() - timedelta(seconds=10)
    assert down.unreachable and down.unreachable_since is not None
    assert Event.objects.filter(instance_id=down.id, message__contains="unreachable").exists()
    assert list(free_instances(fleet)) == [up]


def test_a_host_that_answers_again_is_reachable_and_idle_again(fleet):
    pool, fleet = fleet
    pool[0].stop_sshd()
    age(fleet)
    check_ssh_hosts()
    assert Instance.objects.get(name="pd-0").unreachable
    pool[0].start_sshd()
    age(fleet)
    check_ssh_hosts()
    inst = Instance.objects.get(name="pd-0")
    assert (inst.unreachable, inst.status) == (False, "idle")
    assert inst in free_instances(fleet)


def test_a_checked_host_is_not_checked_again_by_the_next_sweep(fleet):
    pool, fleet = fleet
    pool[0].stop_sshd()  # stays unreachable, so its last_seen never moves
    age(fleet)
    assert check_ssh_hosts() == 2
    assert check_ssh_hosts() == 0, "the check's lease spaces the looks at one host"
