"""Registering an address another project owns tells nothing about that project until the key logs in.

Two users, each admin of a project of their own, through the REST API; real sshd hosts, a real worker.
"""

from __future__ import annotations

import re

import pytest

from tests.conftest import client_for
from tests.ssh_e2e.helpers import fleet_configuration, needs_netns
from tests.sshhosts import _ed25519_keypair
from tests.waiting import wait_until

pytestmark = [*needs_netns, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def _worker(celery_worker, settings):
    settings.MUSTER = {**settings.MUSTER, "SSH_TIMEOUT": 5, "SSH_REGISTER_TIMEOUT": 30}
    return celery_worker


def _register(client, project: str, conf: dict) -> dict:
    """POST the fleet; the 400, or the fleet once its registration settled."""
    resp = client.post(f"/api/projects/{project}/fleets/", {"configuration": conf}, format="json")
    if resp.status_code == 400:
        return {"status": "refused", **resp.json()}
    assert resp.status_code == 202, resp.content

    def done():
        fleet = client.get(f"/api/projects/{project}/fleets/{conf['name']}/").json()
        return fleet if fleet["status"] != "pending" else None

    return wait_until(done, timeout=90, what=f"fleet {conf['name']} to settle")


def _same_text(msg: str, address: str) -> str:
    return re.sub(re.escape(address), "ADDR", msg)


def test_another_projects_host_answers_as_any_host_until_the_key_logs_in(make_user, ssh_hosts):
    pool = ssh_hosts(2, mode="netns")
    owner = client_for(make_user("olga", project="alpha"))
    prober = client_for(make_user("pete", project="beta"))
    assert _register(owner, "alpha", fleet_configuration(pool, name="mine", hosts=[pool[0]]))["status"] == "active"

    stranger = _ed25519_keypair()[0]
    answers = {}
    for host in pool:  # pool[0]: alpha's; pool[1]: nobody's
        conf = fleet_configuration(pool, name=f"probe{host.index}", hosts=[host])
        conf["ssh_config"]["private_key"] = stranger
        fleet = _register(prober, "beta", conf)
        assert fleet["status"] == "failed", fleet
        answers[host.index] = _same_text(fleet["errors"][0]["msg"], f"{host.address}:{host.port}")
    assert "another project" not in answers[0] and "already registered" not in answers[0], answers[0]
    assert answers[0] == answers[1], "an owned host reads exactly like a host nobody registered"

    # With a key the host accepts, the prober could run anything there anyway: now it may be told.
    fleet = _register(prober, "beta", fleet_configuration(pool, name="known", hosts=[pool[0]]))
    assert fleet["status"] == "failed", fleet
    assert "another project" in fleet["errors"][0]["msg"]
    assert "alpha" not in fleet["errors"][0]["msg"] and "mine" not in fleet["errors"][0]["msg"]
    assert owner.get("/api/projects/alpha/fleets/mine/").json()["status"] == "active"


def test_a_host_of_this_project_is_still_refused_before_any_contact(make_user, ssh_hosts):
    pool = ssh_hosts(1, mode="netns")
    owner = client_for(make_user("olga", project="alpha"))
    assert _register(owner, "alpha", fleet_configuration(pool, name="mine"))["status"] == "active"
    fleet = _register(owner, "alpha", fleet_configuration(pool, name="again"))
    assert fleet["status"] == "refused", fleet
    assert "already registered as instance mine-0" in fleet["errors"][0]["msg"]
