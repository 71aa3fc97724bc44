"""A service through the stock dstack 0.22.5 CLI against a live Muster: `dstack apply` submits it
(one job per replica), dstack's client reads its URL as dstack shows it, `dstack ps` lists it, a
second apply with another replica count is an in-place update, and `dstack stop` stops it."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from instances.services.fleets import create_local_fleet
from projects.models import Project
from runs.models import Run
from tests.conftest import token_for
from tests.dstack_cli.helpers import DSTACK, dstack_runner
from tests.waiting import wait_until

pytestmark = [pytest.mark.dstack_cli, pytest.mark.django_db(transaction=True)]

SERVICE = {"type": "service", "name": "web", "port": 8000, "replicas": 2,
           "commands": ["python3 -m http.server 8000 --bind $DSTACK_NODE_IP"]}
SERVICE_URL = "http://127.0.0.1:8001/proxy/services/main/web/"


@pytest.fixture
def admin(make_user, fast_limits, settings):
    settings.MUSTER = {**settings.MUSTER, "LOCAL_FLEET_MEMBERS": False, "ENDPOINT_URL": "http://127.0.0.1:8001"}
    user = make_user("admin")
    user.is_superuser = user.is_staff = True
    user.save()
    fleet = create_local_fleet(Project.objects.get(name="main"), "local", 2, placement="cluster")
    yield user
    from engine.groups import terminate_fleet_instances

    terminate_fleet_instances(fleet)


def _service_url(dstack_home, url: str, token: str) -> str:
    """What dstack's own client makes of the run's service URL (`Run.service_url`, which its apply prints)."""
    code = ("import json, sys; from dstack.api import Client; "
            "c = Client.from_config(project_name='main'); print(json.dumps(c.runs.get('web').service_url))")
    done = subprocess.run([str(DSTACK.parent / "python"), "-c", code], env={"HOME": str(dstack_home), "PATH": "/usr/bin"},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_dstack_cli_applies_lists_updates_and_stops_a_service(live_server, admin, celery_worker, tmp_path):
    dstack = dstack_runner(tmp_path, live_server.url, token_for(admin))
    path = tmp_path / "service.yml"
    path.write_text(yaml.safe_dump(SERVICE))

    applied = dstack("apply", "-f", str(path), "-y", "-d")
    assert applied.returncode == 0, (applied.stdout, applied.stderr)
    run = Run.objects.get(name="web")
    assert run.configuration["type"] == "service" and run.configuration["port"] == 8000
    assert sorted(run.jobs.values_list("replica_num", flat=True)) == [0, 1]
    assert run.desired_replicas == {"0": 2}

    assert _service_url(tmp_path / "dstack-home", live_server.url, token_for(admin)) == SERVICE_URL
    listed = dstack("ps")
    assert listed.returncode == 0, listed.stderr
    assert any(row.split()[:1] == ["web"] for row in listed.stdout.splitlines()), listed.stdout

    path.write_text(yaml.safe_dump({**SERVICE, "replicas": 3}))
    updated = dstack("apply", "-f", str(path), "-y", "-d")
    assert updated.returncode == 0, (updated.stdout, updated.stderr)
    assert "updated" in updated.stdout, (Run.objects.get(name="web").status, updated.stdout)
    run.refresh_from_db()
    assert run.deployment_num == 1 and run.desired_replicas == {"0": 3}

    stopped = dstack("stop", "web", "-y")
    assert stopped.returncode == 0, (stopped.stdout, stopped.stderr)
    wait_until(lambda: Run.objects.get(name="web").finished or None, timeout=120, what="the service to stop")
