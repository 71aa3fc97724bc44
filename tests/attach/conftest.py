"""What the attach tests share: one real sshd host in an SSH fleet, and a user's CLI environment."""

from __future__ import annotations

import os

import pytest

from tests.conftest import token_for
from tests.ssh_e2e.helpers import fleet_configuration, registered_fleet
from tests.waiting import wait_until

ROUTER = """\
type: task
name: routed
fleets: [hosts]
ports: [8000]
commands:
  - echo "router says hi from $DSTACK_NODE_IP" > answer.txt
  - python3 -m http.server 8000 --bind $DSTACK_NODE_IP
"""


@pytest.fixture
def pool(ssh_hosts, project, settings, fast_limits):
    pool = ssh_hosts(1, mode="netns")
    # the test sshd reads the pool's one authorized_keys file, not ~/.ssh/authorized_keys
    settings.MUSTER = {**settings.MUSTER, "SSH_TIMEOUT": 5, "ATTACH_AUTHORIZED_KEYS": str(pool.authorized_keys)}
    registered_fleet(project, {"configuration": fleet_configuration(pool, name="hosts", placement="any")}, actor="test")
    return pool


@pytest.fixture
def cli_env(live_server, make_user, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    return {**os.environ, "HOME": str(home), "MUSTER_URL": live_server.url,
            "MUSTER_TOKEN": token_for(make_user("bob")), "MUSTER_PROJECT": "main"}


def attach_installed(client, public: str, run: str = "routed", timeout: float = 60) -> dict:
    """`POST runs/X/attach` answers 202 at once and a worker installs the key (as `muster attach`
    waits for it): the attach once its status is `installed`."""
    answer = client.post(f"/api/projects/main/runs/{run}/attach", {"job": 0, "public_key": public}, format="json")
    assert answer.status_code == 202, answer.content
    url = f"/api/projects/main/runs/{run}/attach/{answer.json()['id']}"

    def installed():
        now = client.get(url).json()
        assert now["status"] in ("installing", "installed"), now
        return now if now["status"] == "installed" else None
    return wait_until(installed, timeout=timeout, what="the attach key installed by a worker")
