"""A host's Docker facts follow the host after registration: the sweep's health check probes
Docker again (at most every SSH_DOCKER_PROBE_INTERVAL), so Docker installed later is used without
registering the host again, and Docker gone is no longer offered to jobs with `image`."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from engine.ssh_health import check_ssh_hosts
from events.models import Event
from instances.models import Instance
from runs.services import logs
from tests.conftest import token_for
from tests.containers.docker_env import needs_docker, rootfs_tar
from tests.engine.helpers import Beat, wait_for_run
from tests.ssh_e2e.helpers import fleet_configuration, registered_fleet
from tests.waiting import wait_until

pytestmark = [*needs_docker, pytest.mark.django_db(transaction=True)]

IMAGE = "muster-test/late-docker:1"  # imported into the host's daemon: nothing to pull
RUN = """
type: task
name: late-docker
fleets: [late]
image: __IMAGE__
commands: ["echo MARKER $(cat /etc/test-image-marker)"]
""".replace("__IMAGE__", IMAGE)


def muster_instances(live_server, token: str, home: Path) -> dict[str, str]:
    """`muster instances` as a user runs it: the DOCKER column of each host."""
    env = {**os.environ, "HOME": str(home), "MUSTER_URL": live_server.url, "MUSTER_TOKEN": token,
           "MUSTER_PROJECT": "main"}
    out = subprocess.run([sys.executable, "-c", "import sys; from cli.main import main; sys.exit(main())",
                          "instances"], env=env, capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    assert "DOCKER" in out.stdout, out.stdout
    return {words[words.index("late-0")]: words[-1] for words in map(str.split, out.stdout.splitlines())
            if "late-0" in words}


def docker_of(name: str = "late-0") -> dict | None:
    return Instance.objects.get(name=name).resources["docker"]


def plan(api) -> dict:
    resp = api.post("/api/projects/main/runs/plan", {"configuration": RUN}, format="json")
    assert resp.status_code == 200, resp.content
    return resp.json()["capacity"]


def test_docker_installed_after_registration_is_used_and_docker_gone_is_not(
        ssh_hosts, project, api, make_user, live_server, settings, fast_limits, celery_worker):
    settings.MUSTER = {**settings.MUSTER, "SSH_HEALTH_INTERVAL": 0.5, "SSH_HEALTH_TIMEOUT": 5}
    token = token_for(make_user("bob"))
    pool = ssh_hosts(1, mode="netns")
    host = pool[0]
    # Where this host's Docker will listen, as a machine's default socket: nothing answers there yet
    host.announce_docker()
    fleet = registered_fleet(project, {"configuration": fleet_configuration(pool, name="late")}, actor="test")
    assert docker_of() is None
    assert muster_instances(live_server, token, pool.root) == {"late-0": "no"}
    assert "fleet late: no host has Docker; install docker or remove image" in " ".join(plan(api)["reasons"])

    # Docker arrives on the host: its own dockerd, which its SSH sessions reach from now on
    host.start_dockerd()
    subprocess.run(["docker", "-H", f"unix://{host.docker_sock}", "import", "-c", 'CMD ["/bin/sh"]', "-", IMAGE],
                   input=rootfs_tar("late-image"), capture_output=True, check=True, timeout=60)
    version = host.docker("version", "--format", "{{.Server.Version}}").stdout.strip()

    # the pace: registration has just probed, so a health check within the interval does not again
    fleet.instances.update(last_seen=timezone.now() - timedelta(seconds=60), lease_until=None)
    assert check_ssh_hosts() == 1
    assert docker_of() is None, "probed again before SSH_DOCKER_PROBE_INTERVAL (300 s) was over"

    settings.MUSTER = {**settings.MUSTER, "SSH_DOCKER_PROBE_INTERVAL": 1}
    with Beat():  # the sweep, as celery beat runs it
        found = wait_until(docker_of, 30, "the health check finds the new Docker")
        assert found["version"] == version and "runc" in found["runtimes"], found
        assert Event.objects.filter(instance__name="late-0", message__contains=f"Docker {version}").filter(
            message__contains="found: jobs with `image` can run here").count() == 1
        assert muster_instances(live_server, token, pool.root) == {"late-0": version}
        assert plan(api)["fits"] is True

        resp = api.post("/api/projects/main/runs/", {"configuration": RUN}, format="json")
        assert resp.status_code == 201, resp.content
        run = wait_for_run("late-docker", timeout=90)
        job = run.current_jobs().get()
        assert run.status == "done", (job.status, job.termination_reason, job.termination_message, logs.read(job)[-500:])
        assert "MARKER late-image" in logs.read(job).decode(), "the job ran in the image, on the host it got"

        # ...and it goes away again
        host.stop_dockerd()
        wait_until(lambda: docker_of() is None, 30, "the health check notices Docker is gone")
        assert Event.objects.filter(instance__name="late-0", message__startswith="Docker no longer answers").exists()
        assert muster_instances(live_server, token, pool.root) == {"late-0": "no"}
        capacity = plan(api)
        assert capacity["fits"] is False
        assert "fleet late: no host has Docker; install docker or remove image" in " ".join(capacity["reasons"])
