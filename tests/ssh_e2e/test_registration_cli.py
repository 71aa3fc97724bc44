"""`muster fleet apply -f` against a live server, a real Celery worker and real sshd hosts.

The CLI is started as its own process, as a user runs it: it reads identity_file on the user's
machine, sends the key's content, then waits for the asynchronous registration, showing each host's
progress and exiting non-zero when a host fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from instances.models import Fleet
from tests.conftest import token_for
from tests.ssh_e2e.helpers import needs_netns, netns_pool, short_ssh_timeouts  # noqa: F401 - an autouse fixture
from tests.sshhosts import SSHHostPool

pytestmark = [*needs_netns, pytest.mark.django_db(transaction=True)]

MUSTER = [sys.executable, "-c", "import sys; from cli.main import main; sys.exit(main())"]


pool = netns_pool(2)


@pytest.fixture
def muster(live_server, make_user, celery_worker, tmp_path):
    token = token_for(make_user("alice"))
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home), "MUSTER_URL": live_server.url, "MUSTER_TOKEN": token,
           "MUSTER_PROJECT": "main"}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*MUSTER, *args], env=env, capture_output=True, text=True, timeout=180,
                              cwd=Path(__file__).resolve().parents[2])

    return run


def fleet_file(tmp_path: Path, pool: SSHHostPool, hosts: list[dict]) -> Path:
    # The key sits next to the fleet file and is named relative to it, as in a user's repository.
    keys = tmp_path / "conf" / "keys"
    keys.mkdir(parents=True)
    (keys / "id_fleet").write_text(pool.private_key)
    path = tmp_path / "conf" / "fleet.yml"
    path.write_text(yaml.safe_dump({"type": "fleet", "name": "pd", "placement": "any", "ssh_config": {
        "user": pool.user, "identity_file": "keys/id_fleet", "hosts": hosts}}))
    return path


def test_fleet_apply_sends_the_key_waits_and_shows_each_hosts_progress(muster, pool, tmp_path):
    path = fleet_file(tmp_path, pool, [{"hostname": h.address, "port": h.port} for h in pool])
    done = muster("fleet", "apply", "-f", str(path))
    assert done.returncode == 0, done.stderr
    for i, host in enumerate(pool):  # how many steps show depends on timing; each host's end does
        assert f"pd-{i} ({host.address}:{host.port}): ready" in done.stderr
    assert "fleet pd: active" in done.stdout
    fleet = Fleet.objects.get(name="pd")
    assert fleet.private_key == pool.private_key
    assert sorted(fleet.instances.values_list("status", flat=True)) == ["idle", "idle"]


def test_fleet_apply_exits_non_zero_naming_the_host_that_failed(muster, pool, tmp_path):
    path = fleet_file(tmp_path, pool, [{"hostname": pool[0].address, "port": pool[0].port},
                                       {"hostname": pool[1].address, "port": 2222}])
    done = muster("fleet", "apply", "-f", str(path))
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert f"error: ssh_config.hosts[1]: host {pool[1].address}:2222: cannot reach" in done.stderr
    assert f"pd-1 ({pool[1].address}:2222): failed" in done.stderr
    assert "fleet pd: failed" in done.stdout
    assert Fleet.objects.get(name="pd").status == "failed"
