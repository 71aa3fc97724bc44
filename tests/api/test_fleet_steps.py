"""Applying and deleting a fleet write its row and send a message; a claimed step contacts the
hosts (engine/registration.py, engine/fleet_deletion.py), never the call itself."""

from __future__ import annotations

import time

import pytest

from engine import messages, sweeps
from instances.models import Fleet, FleetStatus, Instance
from instances.services.fleets import apply_fleet, create_local_fleet
from tests.engine.helpers import Beat
from tests.sshhosts import _ed25519_keypair
from tests.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def test_applying_an_ssh_fleet_contacts_no_host_and_leaves_it_to_the_registration_step(
        project, settings, monkeypatch):
    # An address nobody answers (TEST-NET-1): a call that logged in would wait out the timeout.
    settings.MUSTER = {**settings.MUSTER, "SSH_TIMEOUT": 20, "SSH_REGISTER_TIMEOUT": 60}
    sent = []
    monkeypatch.setattr(messages, "register_fleet", lambda fleet_id, actor="server": sent.append(fleet_id))
    private, _ = _ed25519_keypair()
    conf = {"type": "fleet", "name": "far", "ssh_config": {
        "user": "root", "private_key": private, "hosts": [{"hostname": "192.0.2.1", "port": 22}]}}

    began = time.monotonic()
    fleet = apply_fleet(project, {"configuration": conf}, actor="test")

    assert time.monotonic() - began < 5, "no host was contacted"
    assert fleet.status == FleetStatus.PENDING and sent == [fleet.pk]
    assert fleet.instances.get().status == "pending"


def test_a_fleet_whose_deletion_message_was_lost_is_deleted_by_the_sweep(project, celery_worker, fast_limits):
    fleet = create_local_fleet(project, "lost", 2, actor="test")
    # what a delete leaves when its message never reaches a worker: the row terminating, unleased
    Fleet.objects.filter(pk=fleet.pk).update(status=FleetStatus.TERMINATING)
    assert sweeps.sweep()["fleet_deletions"] == 1
    with Beat(interval=0.3):
        wait_until(lambda: not Fleet.objects.filter(pk=fleet.pk).exists(), 60, "the fleet deleted by the sweep's step")
    assert set(Instance.objects.filter(name__startswith="lost-").values_list("status", flat=True)) == {"terminated"}
