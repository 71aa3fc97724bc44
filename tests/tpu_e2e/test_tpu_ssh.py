"""Every host of a TPU slice reachable: `muster ssh --job 3` runs a command on host 3 of a v4-32
slice (4 hosts) made through the real TPU client by the fake TPU API, whose hosts are sshd in
network namespaces, and `muster attach` takes a TPU job too (it used to be refused)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

from instances.models import Instance
from runs.models import Run
from tests.attach.conftest import attach_installed
from tests.conftest import token_for
from tests.engine.helpers import wait_for_run
from tests.tpu_e2e.helpers import needs_netns, tpu_task
from tests.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.netns, pytest.mark.slow, needs_netns]

MUSTER = [sys.executable, "-c", "import sys; from cli.main import main; sys.exit(main())"]


def muster(env, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MUSTER, *args], env=env, capture_output=True, text=True, timeout=180,
                          stdin=subprocess.DEVNULL, cwd=Path(__file__).resolve().parents[2])


def test_muster_ssh_reaches_host_3_of_a_v4_32_slice_and_attach_takes_tpu_jobs(
        gcp, tpu_hosts, make_fleet, submit, api, settings, live_server, celery_worker, tmp_path):
    settings.MUSTER = {**settings.MUSTER, "ATTACH_AUTHORIZED_KEYS": str(tpu_hosts.authorized_keys)}
    make_fleet()
    name = submit(tpu_task("tpu-ssh", "v4-32", commands=["sleep 600"], ports=[8000]))
    wait_until(lambda: Run.objects.get(name=name).current_jobs().filter(status="running").count() == 4,
               timeout=120, what="4 jobs running on the slice")
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home), "MUSTER_URL": live_server.url, "MUSTER_PROJECT": "main",
           "MUSTER_TOKEN": token_for(get_user_model().objects.get(username="alice"))}

    done = muster(env, "ssh", name, "--job", "3", "--", 'echo "$TPU_WORKER_ID $DSTACK_NODE_RANK $DSTACK_NODE_IP"')

    assert done.returncode == 0, done.stderr
    assert done.stdout == f"3 3 {gcp.host_addresses[3]}\n"
    # the CLI checked the host key the install step recorded (a TPU VM's is not known before)
    assert Instance.objects.get(index=3, group__kind="tpu_pod").host_key == tpu_hosts[3].host_key
    failed = muster(env, "ssh", name, "--job", "3", "--", "exit 3")
    assert failed.returncode == 3, failed.stderr

    attached = attach_installed(api, Path(home / ".muster" / "attach_key.pub").read_text().strip(), run=name)
    assert attached["backend"] == "gcp" and attached["ssh"]["hostname"] == gcp.host_addresses[0]
    assert attached["ports"] == [8000]

    api.post(f"/api/projects/main/runs/{name}/stop", {"abort": True}, format="json")
    assert wait_for_run(name, timeout=90).status in ("terminated", "aborted")
    assert "muster-attach-" not in tpu_hosts.authorized_keys.read_text()
