"""`muster ssh` into a container job on an SSH host with Docker: the command runs inside the job's
container (its image's files, its working directory, the job's env, which Docker already holds),
through the CLI with a real worker and the host's own dockerd."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from projects.models import Membership
from runs.models import Run
from runs.transitions import request_stop
from tests.conftest import token_for
from tests.containers.docker_env import needs_docker
from tests.ssh_e2e.helpers import fleet_configuration, registered_fleet
from tests.waiting import wait_until

pytestmark = [*needs_docker, pytest.mark.django_db(transaction=True)]

MUSTER = [sys.executable, "-c", "import sys; from cli.main import main; sys.exit(main())"]

BOXED = """
type: task
name: boxed
fleets: [pd]
image: __IMAGE__
env:
  - GREETING=hello-from-the-container
commands:
  - echo inside > here.txt
  - sleep 300
"""


def test_muster_ssh_runs_the_command_in_the_jobs_container(docker_cluster, settings, make_user, fast_limits,
                                                           live_server, celery_worker, tmp_path):
    pool = docker_cluster.pool
    settings.MUSTER = {**settings.MUSTER, "SSH_TIMEOUT": 5, "ATTACH_AUTHORIZED_KEYS": str(pool.authorized_keys)}
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home), "MUSTER_URL": live_server.url, "MUSTER_PROJECT": "main",
           "MUSTER_TOKEN": token_for(make_user("bob"))}
    from projects.models import Project

    registered_fleet(Project.objects.get(name="main"), {"configuration": fleet_configuration(pool)}, actor="test")
    task = tmp_path / "boxed.yml"
    task.write_text(BOXED.replace("__IMAGE__", docker_cluster.push("boxed", "boxed-image")))
    cwd = Path(__file__).resolve().parents[2]

    def muster(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*MUSTER, *args], env=env, capture_output=True, text=True, timeout=180,
                              stdin=subprocess.DEVNULL, cwd=cwd)

    assert muster("apply", "-f", str(task), "-y", "-d").returncode == 0
    wait_until(lambda: Run.objects.filter(name="boxed", jobs__status="running").exists(), timeout=120,
               what="the container job running")
    wait_until(lambda: "inside" in muster("ssh", "boxed", "--", "cat here.txt").stdout, timeout=30,
               what="the job's first command done")

    done = muster("ssh", "boxed", "--", 'cat /etc/test-image-marker; echo "$GREETING in $(pwd)"; exit 4')

    assert done.returncode == 4, done.stderr
    assert done.stdout == "boxed-image\nhello-from-the-container in /workflow\n"
    # on the host itself (outside the container) the image's marker file does not exist
    assert not Path("/etc/test-image-marker").exists()

    # a session's processes inside the container, `setsid` ones too, end when its member goes (without a
    # terminal, the end of the `docker exec` client alone would leave them running)
    held = subprocess.Popen([*MUSTER, "ssh", "boxed", "--", "setsid sleep 1011 & echo open; sleep 1012"], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd)
    try:
        assert held.stdout.readline() == "open\n"
        wait_until(lambda: len(sleeps()) == 2, timeout=10, what="the session's sleeps started")
        Membership.objects.filter(user__username="bob").delete()  # the revoke reaches the host's shell verb
        wait_until(lambda: sleeps() == [], timeout=60, what="the shell's processes in the container ended")
        assert held.wait(30) != 0
    finally:
        held.kill()
        held.wait(10)
        # the job's container must not outlive the test: the next container test counts what it finds
        request_stop(Run.objects.get(name="boxed"), abort=True, actor="test")
        wait_until(lambda: docker_cluster.leftover_containers() == {}, timeout=60,
                   what=f"no container left: {docker_cluster.leftover_containers()}")


def sleeps() -> list[str]:
    return subprocess.run(["pgrep", "-af", "^sleep 101[12]$"], capture_output=True, text=True).stdout.splitlines()
