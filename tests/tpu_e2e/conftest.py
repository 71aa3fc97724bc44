"""Fixtures for TPU pod-slice tests: the fake TPU API whose endpoints are namespace SSH hosts.

The real `google-cloud-tpu` client talks REST to tests/fake_tpu/; the slice it creates reports
one network endpoint per host, and those addresses are real sshd hosts in network namespaces, so
the engine reaches the runner on "TPU host k" exactly as it would reach a TPU VM.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest
import yaml
from django.db import connection

from tests.conftest import example
from tests.fake_tpu import FakeTpuServer
from tests.sshhosts import SSHHostPool


@pytest.fixture(scope="module")
def tpu_hosts(ssh_hosts_session) -> SSHHostPool:
    """Four hosts, shared by the tests of a module (starting sshd in namespaces takes a while)."""
    return ssh_hosts_session(4, mode="netns")


@pytest.fixture
def gcp(settings, fast_limits, fake_tpu: FakeTpuServer, tpu_hosts: SSHHostPool) -> FakeTpuServer:
    """Point the gcp backend at the fake, and the fake's endpoints at the SSH hosts."""
    for host in tpu_hosts:
        host.kill_processes(keep_sshd=True)  # no runner agent left over from an earlier test
    fake_tpu.host_addresses = [h.address for h in tpu_hosts]
    settings.MUSTER = {
        **settings.MUSTER,
        "GCP": {
            "project_id": "test-project",
            "api_endpoint": fake_tpu.endpoint,
            "zones": ["settings-zone-only"],  # the fleet's own zones must win
            "ssh_user": tpu_hosts.user,
            "ssh_private_key": tpu_hosts.private_key,
            "timeout": 5,
        },
        "POD_POLL_INTERVAL": 0.3,
    }
    return fake_tpu


@pytest.fixture
def make_fleet(api) -> Callable[..., dict]:
    """POST examples/tpu-fleet.yml through the API, with `changes` applied on top."""

    def make(**changes) -> dict:
        conf = {**yaml.safe_load(example("tpu-fleet.yml")), **changes}
        response = api.post("/api/projects/main/fleets/", {"configuration": conf}, format="json")
        assert response.status_code == 201, response.content
        return response.json()

    return make


@pytest.fixture
def submit(api) -> Callable[..., str]:
    """POST a run through the API; returns its name."""

    def submit_conf(conf: dict) -> str:
        response = api.post("/api/projects/main/runs/", {"configuration": conf}, format="json")
        assert response.status_code == 201, response.content
        return response.json()["name"]

    return submit_conf


@pytest.fixture
def beat() -> Iterator[None]:
    """What celery beat does in production: engine.sweeps.sweep() every half second (the worker
    fixture sends the batch watch of running jobs, beat's other entry)."""
    from engine.sweeps import sweep

    stop = threading.Event()

    def loop() -> None:
        try:
            while not stop.wait(0.5):
                sweep()
        finally:
            connection.close()

    thread = threading.Thread(target=loop, name="test-beat", daemon=True)
    thread.start()
    yield
    stop.set()
    thread.join(10)
