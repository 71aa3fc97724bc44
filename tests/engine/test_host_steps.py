"""The host-facing steps as process -> outcome -> guarded apply, run in the test process with their
host I/O faked (no worker, no SSH): SSH fleet registration, the removal of due attach lines, and a
fleet's deletion (on a local fleet, whose agents are really told to stop: a file in each host's home)."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
from django.utils import timezone

from engine import attach_revokes, claims, fleet_deletion, registration, ssh_registration
from instances.models import Fleet, GroupKind, Instance, InstanceGroup
from instances.services.fleets import delete_fleet as ask_deletion
from instances.transitions import move_fleet
from runs.models import AttachGrant
from tests.engine.helpers import local_project_fleet
from tests.engine.outcome_helpers import around_body, steal

pytestmark = pytest.mark.django_db(transaction=True)


# ---- register_fleet (the hosts' side faked: ssh_registration.complete_registration) ---------------------


@pytest.fixture
def registered(monkeypatch):
    calls = []

    def complete(fleet, actor="server"):
        calls.append(fleet.pk)
        return claims.Outcome(move=partial(move_fleet, fleet, "active", frm=["pending"], message="registered"))

    monkeypatch.setattr(ssh_registration, "complete_registration", complete)
    return calls


def _ssh_fleet(name: str, status: str = "pending") -> Fleet:
    project = local_project_fleet(size=1, name=f"local-{name}").project
    return Fleet.objects.create(project=project, name=name, backend="ssh", status=status,
                                configuration={"type": "fleet", "name": name})


@pytest.mark.step_case("register_fleet", "eligibility")
@pytest.mark.step_case("register_fleet", "success")
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


@pytest.mark.step_case("register_fleet", "stale")
def test_register_with_a_stale_lease_leaves_the_fleet_to_its_new_holder(sent, registered, monkeypatch):
    fleet = _ssh_fleet("new")
    around_body(monkeypatch, registration, "_register", steal(Fleet))
    registration.register_fleet(fleet.pk)
    fleet.refresh_from_db()
    assert fleet.lease_token == "someone-else"


@pytest.mark.step_case("register_fleet", "contention")
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

    def remove(host, grants, token=None):
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


@pytest.mark.step_case("revoke_attach_keys", "eligibility")
@pytest.mark.step_case("revoke_attach_keys", "success")
def test_revoke_takes_only_the_due_lines_of_the_host_and_leaves_the_rest(sent, removed):
    host = _grants("h", due=2, kept=1)
    assert attach_revokes.revoke_attach_keys(host.pk) == 2
    assert sorted(removed) == ["muster-attach-1-0-x", "muster-attach-1-1-x"]
    assert list(AttachGrant.objects.values_list("marker", "lease_token")) == [("muster-attach-1-2-x", "")]
    assert attach_revokes.revoke_attach_keys(host.pk) == 0, "nothing is due any more"


def test_revoke_of_a_host_that_does_not_answer_backs_its_lines_off(sent, monkeypatch):
    host = _grants("h", due=1)

    def unreachable(host, grants, token=None):
        raise OSError("no route to host")

    monkeypatch.setattr(attach_revokes, "remove_grants", unreachable)
    assert attach_revokes.revoke_attach_keys(host.pk) == 1
    grant = AttachGrant.objects.get()
    assert grant.lease_token == "" and grant.lease_until is not None, "due again after the backoff"
    assert attach_revokes.revoke_attach_keys(host.pk) == 0


@pytest.mark.step_case("revoke_attach_keys", "contention")
def test_revoke_skips_lines_another_worker_is_removing(sent, removed):
    host = _grants("h", due=1)
    token, pks = claims.claim_batch(AttachGrant.objects.all(), 10)
    assert attach_revokes.revoke_attach_keys(host.pk) == 0 and removed == []
    assert AttachGrant.objects.get().lease_token == token
    claims.forget_all()


@pytest.mark.step_case("revoke_attach_keys", "stale")
def test_revoke_whose_lines_were_taken_over_while_the_host_did_not_answer_leaves_them_to_their_holder(
        sent, monkeypatch):
    host = _grants("h", due=1)

    def lost_then_unreachable(host, grants, token=None):
        # the lease ran out while the host hung, and another worker took the lines
        AttachGrant.objects.filter(pk__in=[g.pk for g in grants]).update(lease_token="someone-else",
                                                                         lease_until=timezone.now())
        raise OSError("no route to host")

    monkeypatch.setattr(attach_revokes, "remove_grants", lost_then_unreachable)
    assert attach_revokes.revoke_attach_keys(host.pk) == 1
    grant = AttachGrant.objects.get()
    assert grant.lease_token == "someone-else", "the back-off does not touch the new holder's lease"


def test_revoke_whose_lines_were_taken_over_while_it_edited_the_host_leaves_their_rows_to_their_holder(
        sent, monkeypatch):
    host = _grants("h", due=1)
    edited = []

    def slow_edit(host, path, needles):
        # the host answered late: the lease ran out meanwhile and another worker took the lines
        AttachGrant.objects.update(lease_token="someone-else", lease_until=timezone.now())
        edited.extend(needles)

    monkeypatch.setattr(attach_revokes, "compute_for_instance", lambda inst: _NoHost())
    monkeypatch.setattr(attach_revokes.attach_keys, "remove", slow_edit)
    attach_revokes.revoke_attach_keys(host.pk)
    assert edited, "the host was edited"
    assert AttachGrant.objects.get().lease_token == "someone-else", "the new holder's row is not deleted under it"


class _NoHost:
    def runner_host(self, instance):
        return self

    def close(self):
        pass


# ---- delete_fleet (a local fleet: its agents' stop is a file the agent watches for) ------------------


def _fleet_to_delete(name: str, sent, pod: bool = False) -> Fleet:
    fleet = local_project_fleet(size=2, name=name)
    if pod:
        group = InstanceGroup.objects.create(project=fleet.project, fleet=fleet, name=f"{name}-pod",
                                             kind=GroupKind.TPU_POD, shape="v2-8", status="active",
                                             backend_data={"backend": "gcp"})
        Instance.objects.create(project=fleet.project, fleet=fleet, group=group, index=9, name=f"{name}-pod-0",
                                status="idle", backend="gcp")
    ask_deletion(fleet, actor="alice")
    sent.clear()
    return Fleet.objects.get(pk=fleet.pk)


def _homes(fleet: Fleet) -> list[Path]:
    """The fleet's local hosts' homes, made as an agent's install makes them (a stop needs one)."""
    homes = [Path(i.backend_data["home"]) for i in Instance.objects.filter(name__startswith=f"{fleet.name}-",
                                                                             backend="local")]
    for home in homes:
        home.mkdir(parents=True, exist_ok=True)
    return homes


@pytest.mark.step_case("delete_fleet", "eligibility")
def test_delete_fleet_takes_a_terminating_fleet_only(sent):
    kept = local_project_fleet(size=1, name="kept")
    homes = _homes(kept)
    assert not fleet_deletion.delete_fleet(kept.pk), "a fleet nobody asked to delete stays"
    kept.refresh_from_db()
    assert kept.status == "active" and set(kept.instances.values_list("status", flat=True)) == {"idle"}
    assert homes and not any((home / "agent.stop").exists() for home in homes), "and its agents run on"
    assert sent.messages == []


@pytest.mark.step_case("delete_fleet", "success")
def test_delete_fleet_stops_the_agents_ends_the_hosts_and_removes_the_fleet(sent):
    fleet = _fleet_to_delete("doomed", sent, pod=True)
    homes = _homes(fleet)
    assert fleet_deletion.delete_fleet(fleet.pk, actor="alice")
    assert not Fleet.objects.filter(pk=fleet.pk).exists()
    assert all((home / "agent.stop").exists() for home in homes) and len(homes) == 2
    assert set(Instance.objects.filter(backend="local", name__startswith="doomed-")
               .values_list("status", "fleet")) == {("terminated", None)}
    pod = InstanceGroup.objects.get(name="doomed-pod")
    assert pod.status == "terminating", "the slice is deleted by its own step"
    assert sent.messages == [("terminate_group", pod.pk, 0, False)]


@pytest.mark.step_case("delete_fleet", "stale")
def test_delete_fleet_with_a_stale_lease_leaves_the_fleet_to_its_new_holder(sent, monkeypatch):
    fleet = _fleet_to_delete("doomed", sent)
    around_body(monkeypatch, fleet_deletion, "_delete", steal(Fleet))
    assert not fleet_deletion.delete_fleet(fleet.pk)
    fleet.refresh_from_db()
    assert (fleet.status, fleet.lease_token) == ("terminating", "someone-else"), "not removed under its holder"


@pytest.mark.step_case("delete_fleet", "contention")
def test_delete_fleet_does_nothing_while_another_worker_deletes_it(sent):
    fleet = _fleet_to_delete("doomed", sent)
    homes = _homes(fleet)
    token = claims.claim(Fleet, fleet.pk)
    assert not fleet_deletion.delete_fleet(fleet.pk)
    fleet.refresh_from_db()
    assert (fleet.status, fleet.lease_token) == ("terminating", token)
    assert set(fleet.instances.values_list("status", flat=True)) == {"idle"}
    assert homes and not any((home / "agent.stop").exists() for home in homes), "its hosts are the holder's"
    claims.forget_all()
