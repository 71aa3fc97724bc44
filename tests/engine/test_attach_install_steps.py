"""The attach key install as a claimed step (`install_attach_key`), run in the test process with the
host faked (no worker, no SSH): `POST runs/X/attach` answers 202 without contacting the host, the
step installs the line, a host that does not answer backs the grant off, and the sweep sends the
step again for a lost message or once the backoff is over."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from backends.base import BackendError
from engine import attach_installs, claims, sweeps
from instances.models import Fleet, Instance
from runs.models import AttachGrant, Job
from runs.services.submission import submit_run
from tests.conftest import client_for
from tests.engine.helpers import local_project_fleet
from tests.engine.outcome_helpers import around_body, steal

pytestmark = pytest.mark.django_db(transaction=True)

PUBLIC = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"
TASK = "type: task\nname: routed\nfleets: [local]\nports: [8000]\ncommands: [sleep 60]\n"
URL = "/api/projects/main/runs/routed/attach"


class FakeHost:
    """The job's host as the step sees it: what was installed and removed, and whether it answers."""

    def __init__(self) -> None:
        self.installed: list[str] = []
        self.removed: list[str] = []
        self.answers = True
        self.contacts = 0

    def runner_host(self, instance):
        self.contacts += 1
        return self

    def forward_command(self, ip, ports, keys_expr, grant):
        return f"forward --to {ip} --ports {','.join(map(str, ports))} --grant {grant}"

    def install(self, host, path, line):
        if not self.answers:
            raise BackendError("no route to host")
        self.installed.append(line)

    def remove(self, host, path, needles):
        self.removed.extend(needles)

    def close(self):
        pass


@pytest.fixture
def host(monkeypatch):
    fake = FakeHost()
    monkeypatch.setattr(attach_installs, "compute_for_instance", lambda inst: fake)
    monkeypatch.setattr(attach_installs.attach_keys, "install", fake.install)
    monkeypatch.setattr(attach_installs.attach_keys, "remove", fake.remove)
    # the sweep's health check would try the fake host's address: reachability is set by the tests
    monkeypatch.setattr(sweeps, "check_ssh_hosts", lambda now: 0)
    return fake


@pytest.fixture
def running(make_user, sent):
    """Job 0 of `routed` running on an SSH host (the rows only: nothing listens at its address)."""
    local = local_project_fleet(size=1)
    project = local.project
    fleet = Fleet.objects.create(project=project, name="hosts", backend="ssh", status="active")
    inst = Instance.objects.create(project=project, fleet=fleet, name="hosts-0", backend="ssh", status="busy",
                                   hostname="10.9.9.9", internal_ip="10.9.9.9", username="muster",
                                   host_key="ssh-ed25519 AAAAHOSTKEY")
    run = submit_run(project, None, {"configuration": TASK})
    Job.objects.filter(run=run).update(status="running", instance=inst)
    sent.clear()
    return client_for(make_user("writer")), inst


def _attach(writer) -> int:
    answer = writer.post(URL, {"job": 0, "public_key": PUBLIC}, format="json")
    assert answer.status_code == 202, answer.content
    assert answer.json()["status"] == "installing" and "ssh" not in answer.json()
    return answer.json()["id"]


def _status(writer, grant: int) -> dict:
    answer = writer.get(f"{URL}/{grant}")
    assert answer.status_code == 200, answer.content
    return answer.json()


@pytest.mark.step_case("install_attach_key", "eligibility")
@pytest.mark.step_case("install_attach_key", "success")
def test_the_request_answers_202_without_the_host_and_the_step_installs_the_line(sent, host, running):
    writer, inst = running
    grant = _attach(writer)
    assert host.contacts == 0 and host.installed == [], "the request did not contact the host"
    assert sent.names() == [("install_attach_key", grant)]
    assert _status(writer, grant)["status"] == "installing"

    assert attach_installs.install_attach_key(grant)
    [line] = host.installed
    assert line.startswith('restrict,command="forward --to 10.9.9.9 --ports 8000 --grant muster-attach-')
    assert PUBLIC in line and line.endswith("-writer")
    row = AttachGrant.objects.get()
    assert (row.install_due, row.lease_token, row.install_error) == (False, "", "")
    done = _status(writer, grant)
    assert done["status"] == "installed" and done["ports"] == [8000]
    assert done["ssh"] == {"hostname": "10.9.9.9", "port": 22, "username": "muster",
                           "host_key": "ssh-ed25519 AAAAHOSTKEY"}
    assert not attach_installs.install_attach_key(grant), "an installed grant is not installed again"
    assert len(host.installed) == 1
    # somebody else's look at the grant is the 404-like answer of an unknown one
    other = client_for(type(AttachGrant.objects.get().user).objects.create_user(username="other"))
    assert other.get(f"{URL}/{grant}").status_code in (403, 404)


def test_a_host_that_does_not_answer_backs_the_grant_off_and_the_sweep_installs_it_once_it_answers(
        sent, host, running, settings):
    writer, inst = running
    host.answers = False
    grant = _attach(writer)
    assert not attach_installs.install_attach_key(grant)
    row = AttachGrant.objects.get()
    assert row.install_due and row.lease_token == "" and row.lease_until > timezone.now(), "backed off"
    waiting = _status(writer, grant)
    assert waiting["status"] == "installing" and "no route to host" in waiting["error"]

    host.answers = True
    sent.clear()
    sweeps.sweep()
    assert ("install_attach_key", grant) not in sent.names(), "not before the backoff is over"
    AttachGrant.objects.update(lease_until=timezone.now() - timedelta(seconds=1),
                               created=timezone.now() - timedelta(hours=1))
    Instance.objects.filter(pk=inst.pk).update(unreachable=True)
    sweeps.sweep()
    assert ("install_attach_key", grant) not in sent.names(), "not while the host is unreachable"
    Instance.objects.filter(pk=inst.pk).update(unreachable=False)
    sweeps.sweep()
    assert ("install_attach_key", grant) in sent.names()
    assert attach_installs.install_attach_key(grant) and len(host.installed) == 1
    assert _status(writer, grant)["status"] == "installed"


def test_a_lost_message_is_sent_again_by_the_sweep(sent, host, running):
    writer, _ = running
    grant = _attach(writer)
    sent.clear()  # the request's message is lost
    sweeps.sweep()
    assert ("install_attach_key", grant) not in sent.names(), "a new grant's message is on its way, not lost"
    AttachGrant.objects.update(created=timezone.now() - timedelta(hours=1))
    found = sweeps.sweep()
    assert ("install_attach_key", grant) in sent.names(), found
    assert attach_installs.install_attach_key(grant)
    sent.clear()
    sweeps.sweep()
    assert ("install_attach_key", grant) not in sent.names(), "nothing is due once installed"


def test_a_grant_whose_job_ended_before_the_install_is_withdrawn_not_installed(sent, host, running):
    writer, _ = running
    grant = _attach(writer)
    Job.objects.update(status="terminating")  # the stop's end (engine/finishing.py) has not run yet
    assert not attach_installs.install_attach_key(grant)
    assert host.installed == []
    row = AttachGrant.objects.get()
    assert (row.install_due, row.revoke_due) == (False, True), "an earlier try's line goes with the grant"
    assert ("revoke_attach_keys", row.instance_id) in sent.names()
    assert _status(writer, grant)["status"] == "withdrawn"


def test_a_line_that_lands_after_the_jobs_end_took_the_grant_is_taken_off_again(sent, host, running, monkeypatch):
    writer, _ = running
    grant = _attach(writer)
    real = host.install

    def slow_install(h, path, line):
        real(h, path, line)
        # the job's end marked the grant and removed the lines while this one was on its way
        AttachGrant.objects.filter(pk=grant).delete()

    monkeypatch.setattr(attach_installs.attach_keys, "install", slow_install)
    assert not attach_installs.install_attach_key(grant)
    assert len(host.installed) == 1 and len(host.removed) == 1
    assert host.removed[0].startswith(" muster-attach-")
    assert not AttachGrant.objects.exists()
    assert _status(writer, grant)["status"] == "withdrawn"


@pytest.mark.step_case("install_attach_key", "stale")
def test_an_install_whose_grant_was_taken_over_leaves_it_to_its_new_holder(sent, host, running, monkeypatch):
    writer, _ = running
    grant = _attach(writer)
    around_body(monkeypatch, attach_installs, "_install", steal(AttachGrant))
    assert not attach_installs.install_attach_key(grant)
    row = AttachGrant.objects.get()
    assert row.lease_token == "someone-else" and row.install_due, "the new holder's row is left as it is"


@pytest.mark.step_case("install_attach_key", "contention")
def test_an_install_does_nothing_while_another_worker_installs_the_grant(sent, host, running):
    writer, _ = running
    grant = _attach(writer)
    token = claims.claim(AttachGrant, grant)
    assert not attach_installs.install_attach_key(grant)
    assert host.installed == [] and AttachGrant.objects.get().lease_token == token
    claims.forget_all()
