"""Shared pieces of the SSH fleet tests: the skip marks, fleet configurations, and host inspection."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.engine.helpers import Beat  # noqa: F401  (beat's sweep includes the SSH host checks)
from tests.sshhosts import SSHHost, SSHHostPool
from tests.waiting import wait_until

L40S = ("L40S", 46068)  # what `nvidia-smi` on an L40S host reports: 46068 MiB

needs_netns = [
    pytest.mark.netns,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None, reason="needs root and iproute2"),
    pytest.mark.skipif(not os.path.exists("/usr/sbin/sshd"), reason="needs OpenSSH sshd"),
]


def fleet_configuration(pool: SSHHostPool, name: str = "pd", hosts: list[SSHHost] | None = None,
                        placement: str = "cluster", **ssh) -> dict:
    """A fleet configuration object as a client sends it: the key as content, hosts as address + port."""
    chosen = list(pool) if hosts is None else hosts
    return {
        "type": "fleet", "name": name, "placement": placement,
        "ssh_config": {
            "user": pool.user, "private_key": pool.private_key,
            "hosts": [{"hostname": h.address, "port": h.port} for h in chosen],
            **ssh,
        },
    }


def host_commands(host: SSHHost) -> list[str]:
    """Command lines of every process running on the host (in its network namespace)."""
    found = []
    for pid in host.pids():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        found.append(cmdline.strip())
    return found


def runner_processes(host: SSHHost) -> list[str]:
    """Command lines of the muster_runner processes (agent or job runners) running on the host."""
    return [c for c in host_commands(host) if "muster_runner" in c]


def break_python(host: SSHHost) -> None:
    """Make `python3` fail on the host (first on its PATH), so the runner agent cannot start there."""
    script = host.bin_dir / "python3"
    script.write_text("#!/bin/sh\necho 'python3 is broken on this test host' >&2\nexit 1\n")
    script.chmod(0o755)




# ---- registering through the API (asynchronous: 202 pending, then a Celery task settles it) -------

FLEETS_URL = "/api/projects/main/fleets/"


def post_fleet(api, configuration: dict):
    return api.post(FLEETS_URL, {"configuration": configuration}, format="json")


def settled(api, name: str, timeout: float = 90) -> dict:
    """The fleet once its registration task has made it active or failed."""
    from tests.waiting import wait_until

    def done():
        fleet = api.get(f"{FLEETS_URL}{name}/").json()
        return fleet if fleet["status"] != "pending" else None

    return wait_until(done, timeout=timeout, what=f"fleet {name} to finish registering")


def register(api, configuration: dict) -> dict:
    """POST a fleet, expect 202 pending, and return it once settled."""
    resp = post_fleet(api, configuration)
    assert resp.status_code == 202, resp.content
    assert resp.json()["status"] == "pending"
    assert all(i["status"] == "pending" for i in resp.json()["instances"])
    return settled(api, configuration["name"])


def live_counts() -> tuple[int, int, int]:
    from instances.models import Fleet, Instance, InstanceGroup

    return (Fleet.objects.exclude(status="failed").count(), Instance.objects.exclude(status="terminated").count(),
            InstanceGroup.objects.count())


def refused(api, configuration: dict, loc: list) -> str:
    """POST; expect a 400 at `loc`, or a registration that fails at `loc`; nothing live is left. The message."""
    before = live_counts()
    resp = post_fleet(api, configuration)
    if resp.status_code == 400:
        errors = resp.json()["errors"]
    else:
        assert resp.status_code == 202, resp.content
        fleet = settled(api, configuration["name"])
        assert fleet["status"] == "failed", fleet
        assert all(i["status"] == "terminated" for i in fleet["instances"])
        errors = fleet["errors"]
    assert [e["loc"] for e in errors] == [loc], errors
    assert live_counts() == before, "a refused registration leaves nothing live"
    return errors[0]["msg"]


def netns_pool(n: int):
    """A module-scoped `pool` fixture: `n` netns test hosts the module's tests share."""

    @pytest.fixture(scope="module")
    def pool():
        with SSHHostPool(n, mode="netns") as made:
            yield made

    return pool


@pytest.fixture(autouse=True)
def short_ssh_timeouts(settings):
    """Imported, it applies to every test of the module: an address nobody answers at costs seconds,
    not the production 10 s per attempt."""
    settings.MUSTER = {**settings.MUSTER, "SSH_TIMEOUT": 3, "SSH_REGISTER_TIMEOUT": 30}


def registered_fleet(project, payload, actor: str = "test", user=None):
    """apply_fleet, then its registration step run here, as a worker runs it: the fleet comes back
    active (or failed, with `errors`). With a worker running as well, whichever claims the fleet
    first registers it; this waits for the row either way."""
    from engine import registration
    from instances.models import FleetStatus
    from instances.services.fleets import apply_fleet

    fleet = apply_fleet(project, payload, actor=actor, user=user)
    registration.register_fleet(fleet.pk, actor=actor)
    fleet.refresh_from_db()
    wait_until(lambda: fleet.refresh_from_db() or fleet.status != FleetStatus.PENDING, 120, f"fleet {fleet.name} registered")
    return fleet


def deleted_fleet(fleet, force: bool = False, actor: str = "test") -> None:
    """delete_fleet, then its deletion step run here, as a worker runs it (or waited for, if a
    worker claimed it first): the fleet is gone when this returns."""
    from engine import fleet_deletion
    from instances.models import Fleet
    from instances.services.fleets import delete_fleet

    delete_fleet(fleet, force=force, actor=actor)
    fleet_deletion.delete_fleet(fleet.pk, actor=actor)
    wait_until(lambda: not Fleet.objects.filter(pk=fleet.pk).exists(), 120, f"fleet {fleet.name} deleted")
