"""SSH fleet registration is a claimed step: a lost, duplicated or failed registration message
still ends with one registration, an active fleet and one live runner agent per host.

Real sshd hosts in network namespaces, a real Celery worker (two threads, so that a duplicated
message really runs twice at once) and the sweep (Beat).
"""

from __future__ import annotations

import time

import pytest

from backends.ssh.runner_host import SSHRunnerHost
from engine import ssh_registration
from events.models import Event
from instances.models import Fleet, Instance
from instances.services import ssh_fleets
from runs.services.submission import submit_run
from tests.engine.faults import celery_worker_parameters, celery_worker_pool, inject  # noqa: F401
from tests.engine.helpers import wait_for_run
from tests.ssh_e2e.helpers import (
    Beat,
    fleet_configuration,
    needs_netns,
    post_fleet,
    runner_processes,
    settled,
)
from tests.sshhosts import SSHHostPool
from tests.waiting import job_states, wait_until

pytestmark = [*needs_netns, pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture(scope="module")
def pool():
    with SSHHostPool(2, mode="netns") as pool:
        yield pool


@pytest.fixture(autouse=True)
def limits(fast_limits, settings, pool):
    settings.MUSTER = {**settings.MUSTER, "SSH_TIMEOUT": 3, "SSH_REGISTER_TIMEOUT": 30, "LEASE_SECONDS": 3}
    yield
    for host in pool:  # every test registers the same two hosts afresh
        host.kill_processes(keep_sshd=True)


class FailOnce:
    """Wraps a function the registration calls: its first call raises what nobody expects."""

    def __init__(self, function):
        self.function, self.calls = function, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("an unexpected fault inside the registration")
        return self.function(*args, **kwargs)


def _agents(host) -> list[str]:
    return [c for c in runner_processes(host) if " agent " in f"{c} "]


def _agent_alive(inst: Instance) -> bool:
    runner = SSHRunnerHost(inst.ssh_target(), timeout=10)
    try:
        return runner.status()["agent_alive"] is True
    finally:
        runner.close()


def _registered_once(name: str, pool) -> None:
    fleet = Fleet.objects.get(name=name)
    assert fleet.status == "active"
    assert fleet.lease_token == "", "the claim is given back"
    for inst in fleet.instances.all():
        assert inst.status == "idle" and inst.backend_data["registration"] == "ready"
        assert _agent_alive(inst), f"the runner agent on {inst.name} runs"
    for host in pool:
        assert len(_agents(host)) == 1, f"one agent on {host}, not {_agents(host)}"


def _run_on(fleet: str, name: str):
    conf = f"type: task\nname: {name}\nfleets: [{fleet}]\nnodes: 2\ncommands:\n  - echo rank $DSTACK_NODE_RANK\n"
    project = Fleet.objects.get(name=fleet).project
    return wait_for_run(submit_run(project, None, {"configuration": conf}).name, timeout=60)


def test_a_lost_registration_message_is_sent_again_by_the_sweep(api, pool, celery_worker, monkeypatch):
    faulty = inject(monkeypatch, "register_fleet", "drop")
    with Beat(interval=0.3):
        resp = post_fleet(api, fleet_configuration(pool, name="lost"))
        assert resp.status_code == 202, resp.content
        assert settled(api, "lost", timeout=40)["status"] == "active"
    assert faulty.dropped == 1 and faulty.sent >= 2, "the first message was dropped and another sent"
    _registered_once("lost", pool)


def test_a_registration_message_delivered_twice_registers_once_and_keeps_the_agents(
        api, pool, celery_worker, monkeypatch):
    faulty = inject(monkeypatch, "register_fleet", "twice")
    resp = post_fleet(api, fleet_configuration(pool, name="twice"))
    assert resp.status_code == 202, resp.content
    assert settled(api, "twice", timeout=40)["status"] == "active"
    assert faulty.doubled >= 1, "the message was sent twice"
    time.sleep(3)  # the second delivery is over by now, whatever it did
    _registered_once("twice", pool)
    assert Event.objects.filter(subject="fleet twice", message__startswith="registered").count() == 1
    with Beat(interval=0.3):
        run = _run_on("twice", "after-twice")
    assert run.status == "done", job_states(run)


def test_an_exception_inside_the_registration_gives_the_claim_back_and_the_next_try_registers(
        api, pool, celery_worker, monkeypatch):
    fault = FailOnce(ssh_registration._activate)
    monkeypatch.setattr(ssh_registration, "_activate", fault)
    with Beat(interval=0.3):
        resp = post_fleet(api, fleet_configuration(pool, name="flaky"))
        assert resp.status_code == 202, resp.content
        assert settled(api, "flaky", timeout=40)["status"] == "active"
        assert fault.calls == 2, "the step failed once and was done again"
        _registered_once("flaky", pool)  # the agents the first try started are reused, not doubled
        run = _run_on("flaky", "after-flaky")
    assert run.status == "done", job_states(run)


def test_a_registration_that_fails_unexpectedly_on_every_try_is_given_up_and_its_agents_stopped(
        api, pool, celery_worker, monkeypatch, settings):
    """Retries end: a registration that hits a server bug every time used to stay pending for ever,
    contacting the user's hosts again after every backoff."""
    settings.MUSTER = {**settings.MUSTER, "SSH_REGISTER_GIVE_UP": 4.0}
    calls = []

    def always_fails(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("an unexpected fault on every try")

    monkeypatch.setattr(ssh_registration, "_activate", always_fails)  # after the agents have started
    with Beat(interval=0.3):
        resp = post_fleet(api, fleet_configuration(pool, name="doomed"))
        assert resp.status_code == 202, resp.content
        fleet = settled(api, "doomed", timeout=60)
    assert fleet["status"] == "failed", fleet
    assert "did not complete within 4 s" in str(fleet["errors"]), fleet["errors"]
    assert calls, "the registration was tried before it was given up"
    for host in pool:
        wait_until(lambda h=host: not _agents(h), timeout=20, what=f"the agents started on {host} stopped")


def test_a_registration_whose_worker_died_is_taken_up_again_and_reuses_its_agents(api, pool, project,
                                                                                   celery_worker):
    from engine import claims

    conf = fleet_configuration(pool, name="orphan")
    fleet = ssh_fleets.start_ssh_fleet(project, _validated(conf), actor="test")  # written, no message
    # What a worker killed mid-registration leaves: the row claimed by a token nobody renews, and
    # the runner agent already started on one host.
    assert claims.claim(Fleet, fleet.pk, status="pending") is not None
    claims.forget_all()
    first = fleet.instances.get(index=0)
    SSHRunnerHost(first.ssh_target(), timeout=10).ensure_agent()
    assert len(_agents(pool[0])) == 1
    with Beat(interval=0.3):
        wait_until(lambda: Fleet.objects.get(pk=fleet.pk).status != "pending", timeout=40,
                   what="the fleet to be registered again")
        _registered_once("orphan", pool)
        run = _run_on("orphan", "after-orphan")
    assert run.status == "done", job_states(run)


def _validated(conf: dict) -> dict:
    """A fleet configuration as the API passes it to start_ssh_fleet (validated, defaults filled)."""
    from instances.services.fleets import _configuration

    return _configuration({"configuration": conf})[0]
