"""What the attach tests share: one real sshd host in an SSH fleet, and a user's CLI environment."""

from __future__ import annotations

import os

import pytest

from tests.conftest import token_for
from tests.ssh_e2e.helpers import fleet_configuration, registered_fleet

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
