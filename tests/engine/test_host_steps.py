"""The host-facing steps as process -> outcome -> guarded apply, run in the test process with their
host I/O faked (no worker, no SSH): SSH fleet registration and the removal of due attach lines."""

from __future__ import annotations

import pytest

from engine import attach_revokes, claims, messages, registration, ssh_registration
from instances.models import Fleet
from runs.models import AttachGrant
from tests.engine.helpers import local_project_fleet
from tests.engine.outcome_helpers import Sent, around_body, steal

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def sent(monkeypatch):
    fake = Sent()
    monkeypatch.setattr(messages, "registered", fake)
    return fake


# ---- register_fleet (the hosts' side faked: ssh_registration.complete_registration) ---------------------


@pytest.fixture
def registered(monkeypatch):
    calls = []

    def complete(fleet, actor="server"):
        calls.append(fleet.pk)
        return claims.Outcome(move=lambda token: Fleet.objects.filter(
            pk=fleet.pk, status="pending", lease_token=token).update(status="active", lease_until=None, lease_token="") == 1)

    monkeypatch.setattr(ssh_registration, "complete_registration", complete)
    return calls


def _ssh_fleet(name: str, status: str = "pending") -> Fleet:
    project = local_project_fleet(size=1, name=f"local-{name}").project
    return Fleet.objects.create(project=project, name=name, backend="ssh", status=status,
                                configuration={"type": "fleet", "name": name})


def test_register_takes_a_pending_ssh_fleet_only_and_leaves_it_free(sent, registered):
    active, pending = _ssh_fleet("done", "active"), _ssh_fleet("new")
    local = Fleet.objects.get(name="local-new")
    Fleet.objects.filter(pk=local.pk).update(status="pending")
    assert not registration.register_fleet(active.pk), "an active fleet is not registered again"
    assert not registration.register_fleet(local.pk), "a local fleet has no hosts to contact"
    assert registration.register_fleet(pending.pk)
    pending.refresh_from_db()
    assert (pending.status, pending.lease_token) == ("active", "") and registered == [pending.pk]
    assert sent.messages == []


def test_register_with_a_stale_lease_leaves_the_fleet_to_its_new_holder(sent, registered, monkeypatch):
    fleet = _ssh_fleet("new")
    around_body(monkeypatch, registration, "_register", steal(Fleet))
    registration.register_fleet(fleet.pk)
    fleet.refresh_from_db()
    assert fleet.lease_token == "someone-else"


def test_register_does_nothing_while_another_worker_registers_the_fleet(sent, registered):
    fleet = _ssh_fleet("new")
    token = claims.claim(Fleet, fleet.pk)
    assert not registration.register_fleet(fleet.pk)
    fleet.refresh_from_db()
    assert (fleet.status, fleet.lease_token) == ("pending", token) and registered == []
    claims.forget_all()


# ---- revoke_attach_keys (the host's side faked: attach_revokes.remove_grants) -----------------------------


@pytest.fixture
def removed(monkeypatch):
    lines = []

    def remove(host, grants):
        lines.extend(g.marker for g in grants)
        AttachGrant.objects.filter(pk__in=[g.pk for g in grants]).delete()

    monkeypatch.setattr(attach_revokes, "remove_grants", remove)
    return lines


def _grants(name: str, due: int, kept: int = 0):
    fleet = local_project_fleet(size=1, name=f"local-{name}")
    host = fleet.instances.get()
    for k in range(due + kept):
        AttachGrant.objects.create(instance=host, project=fleet.project, marker=f"muster-attach-1-{k}-x",
                                   revoke_due=k < due)
    return host


def test_revoke_takes_only_the_due_lines_of_the_host_and_leaves_the_rest(sent, removed):
    host = _grants("h", due=2, kept=1)
    assert attach_revokes.revoke_attach_keys(host.pk) == 2
    assert sorted(removed) == ["muster-attach-1-0-x", "muster-attach-1-1-x"]
    assert list(AttachGrant.objects.values_list("marker", "lease_token")) == [("muster-attach-1-2-x", "")]
    assert attach_revokes.revoke_attach_keys(host.pk) == 0, "nothing is due any more"


def test_revoke_of_a_host_that_does_not_answer_backs_its_lines_off(sent, monkeypatch):
    host = _grants("h", due=1)

    def unreachable(host, grants):
        raise OSError("no route to host")

    monkeypatch.setattr(attach_revokes, "remove_grants", unreachable)
    assert attach_revokes.revoke_attach_keys(host.pk) == 1
    grant = AttachGrant.objects.get()
    assert grant.lease_token == "" and grant.lease_until is not None, "due again after the backoff"
    assert attach_revokes.revoke_attach_keys(host.pk) == 0


def test_revoke_skips_lines_another_worker_is_removing(sent, removed):
    host = _grants("h", due=1)
    token, pks = claims.claim_batch(AttachGrant.objects.all(), 10)
    assert attach_revokes.revoke_attach_keys(host.pk) == 0 and removed == []
    assert AttachGrant.objects.get().lease_token == token
    claims.forget_all()
