"""A registration whose fleet was deleted while it contacted the hosts stops the runner agents it
started, but never inside a transaction: the stop is a message sent once the step's give-back has
committed (engine/ssh_registration.py), and its worker contacts the hosts with no transaction open.
The hosts' side is faked (what contacting them found); the stop's own SSH is recorded, not made."""

from __future__ import annotations

import pytest
from django.db import connection

from engine import groups, registration, ssh_registration
from engine.ssh_registration import HostFacts
from instances.models import Fleet, Instance
from muster import crypto
from tests.engine.helpers import local_project_fleet

pytestmark = pytest.mark.django_db(transaction=True)

KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nnot a real key\n-----END OPENSSH PRIVATE KEY-----"
PROBE = {"cpus": 2, "memory_gb": 4, "disk_gb": 10, "cpu_arch": "x86_64", "gpus": [], "internal_ip": "10.0.0.5"}


@pytest.fixture
def stops(monkeypatch):
    """Each stop of runner agents: the hosts' (where, private key, host key), and whether a transaction was open."""
    calls = []

    def stop_agents_on(hosts):
        calls.append(([(where, host.target.private_key, host.target.host_key) for where, host in hosts],
                      connection.in_atomic_block))

    monkeypatch.setattr(groups, "stop_agents_on", stop_agents_on)
    return calls


def _pending_ssh_fleet() -> Fleet:
    project = local_project_fleet(size=1, name="local-stop").project
    fleet = Fleet.objects.create(project=project, name="ssh-stop", backend="ssh", status="pending",
                                 configuration={"type": "fleet", "name": "ssh-stop"})
    Instance.objects.create(project=project, fleet=fleet, index=0, name="ssh-stop-0", backend="ssh",
                            status="pending", hostname="192.0.2.7", port=2222, username="ubuntu",
                            private_key_encrypted=crypto.encrypt(KEY))
    return fleet


def test_the_agents_of_a_fleet_deleted_while_it_registered_are_stopped_after_commit(monkeypatch, sent, stops):
    fleet = _pending_ssh_fleet()

    def contacted(fleet, instances, targets):
        Fleet.objects.filter(pk=fleet.pk).delete()  # the user deletes it while its hosts answer
        facts = [HostFacts("ssh-ed25519 AAAAstarted", PROBE)]
        return facts, facts

    monkeypatch.setattr(ssh_registration, "_contact_all", contacted)
    assert registration.register_fleet(fleet.pk)
    assert stops == [], "no host is contacted inside the step's transaction"
    [(name, hosts, _, _)] = sent.messages
    assert name == "stop_registered_agents"
    assert KEY not in repr(hosts), "the key travels encrypted, as the database holds it"
    ssh_registration.stop_registered_agents(hosts)  # the worker that takes the message
    assert stops == [([("ubuntu@192.0.2.7:2222", KEY, "ssh-ed25519 AAAAstarted")], False)]
