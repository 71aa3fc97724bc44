"""A slice waiting at Google as a queued resource, as a user sees it: `muster instances` (its own
process, against a live server) and the console's fleets page name the request, its zone and state;
the run's jobs say how long they have been queued; a stopped run withdraws its request."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from django.contrib.auth import get_user_model
from django.test import Client

from instances.models import InstanceGroup
from tests.conftest import example, token_for
from tests.tpu_e2e.helpers import ZONES, needs_netns, tpu_task
from tests.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.netns, pytest.mark.slow, needs_netns]

MUSTER = [sys.executable, "-c", "import sys; from cli.main import main; sys.exit(main())"]


def test_a_waiting_queued_resource_shows_in_muster_instances_the_console_and_the_jobs(
        gcp, api, submit, live_server, tmp_path, celery_worker):
    gcp.queued_script[ZONES[0]] = ["CREATING", "WAITING_FOR_RESOURCES"]  # waits for as long as the test
    conf = yaml.safe_load(example("tpu-queued-spot-fleet.yml"))
    assert api.post("/api/projects/main/fleets/", {"configuration": conf}, format="json").status_code == 201
    name = submit(tpu_task("waiting", "v4-16", fleets=["tpu-queued"]))
    wait_until(lambda: InstanceGroup.objects.filter(
        backend_data__create__qr_state="WAITING_FOR_RESOURCES").exists(), 30, "the request waiting")
    pod = InstanceGroup.objects.get(kind="tpu_pod")
    said = f"queued resource projects/test-project/locations/{ZONES[0]}/queuedResources/{pod.name} " \
           f"in {ZONES[0]}: WAITING_FOR_RESOURCES"

    alice = get_user_model().objects.get(username="alice")
    env = {**os.environ, "HOME": str(tmp_path), "MUSTER_URL": live_server.url, "MUSTER_TOKEN": token_for(alice),
           "MUSTER_PROJECT": "main"}
    shown = subprocess.run([*MUSTER, "instances"], env=env, capture_output=True, text=True, timeout=120,
                           cwd=Path(__file__).resolve().parents[2], stdin=subprocess.DEVNULL)
    assert shown.returncode == 0, shown.stderr
    assert f"pod {pod.name} (tpu_pod, v4-16) in fleet tpu-queued" in shown.stdout
    assert said in shown.stdout, shown.stdout

    alice.set_password("alice-console-pw-1")
    alice.save()
    browser = Client()
    assert browser.post("/login/", {"username": "alice", "password": "alice-console-pw-1"}).status_code == 302
    page = browser.get("/projects/main/fleets/").content.decode()
    assert said in page[page.index(f"TPU pod {pod.name}"):]

    jobs = api.get(f"/api/projects/main/runs/{name}/").json()["jobs"]
    assert {j["status"] for j in jobs} == {"provisioning"}
    assert all(j["status_message"].startswith(f"queued in {ZONES[0]}: WAITING_FOR_RESOURCES for ") for j in jobs)

    # stopped while queued: the request is withdrawn, not left to become a slice nobody uses
    assert api.post(f"/api/projects/main/runs/{name}/stop", {"abort": True}, format="json").status_code in (200, 202)
    wait_until(lambda: gcp.queued == {}, 30, "the request withdrawn")
    wait_until(lambda: InstanceGroup.objects.get(pk=pod.pk).status == "terminated", 30, "the pod rows ended")
