"""The engine's replica moves seen through the endpoint process (which re-reads a service only on
PostgreSQL's NOTIFY here: its timer is a minute): a replica killed on its host while requests
stream in, every request answered, the replica back; a replica whose probe fails gets no request."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import requests

from runs.models import Job
from tests.conftest import token_for
from tests.engine.helpers import Beat, local_project_fleet
from tests.engine.service_helpers import ready, service_yaml, wait_until
from tests.serving.replicas import free_port
from tests.serving.test_endpoint import endpoint  # noqa: F401 (the fixture)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

RETRY = "retry:\n  on_events: [error, interruption]\n  duration: 1h\n"


def _start(superuser_api, django_user_model, endpoint, tmp_path, port):  # noqa: F811
    local_project_fleet(size=2)
    answer = superuser_api.post("/api/projects/main/runs/", {"configuration": service_yaml(
        "web", tmp_path, extra=RETRY, port=port)}, format="json")
    assert answer.status_code == 201, answer.json()
    first = wait_until(lambda: (r := ready("web")) and len(r) == 2 and r, 60, "two replicas ready")
    key = token_for(django_user_model.objects.get(username="root"))
    return first, f"{endpoint.url}/proxy/services/main/web/", {"Authorization": f"Bearer {key}"}


def test_a_killed_replica_is_replaced_while_every_request_through_the_endpoint_succeeds(
        fast_limits, celery_worker, superuser_api, endpoint, django_user_model, tmp_path):  # noqa: F811
    first, where, auth = _start(superuser_api, django_user_model, endpoint, tmp_path, free_port())
    victim = first[0]
    assert requests.get(where + "version", headers=auth, timeout=10).text.strip() == "v1"
    os.kill(int((Path(tmp_path) / victim.instance.internal_ip / "pid").read_text()), signal.SIGKILL)
    codes = []
    with Beat():
        def back() -> bool:
            codes.append(requests.get(where + "version", headers=auth, timeout=10).status_code)
            now = ready("web")
            return len(now) == 2 and any(j.replica_num == victim.replica_num and j.submission_num == 1 for j in now)
        wait_until(back, 90, "the killed replica replaced and ready", every=0.1)
    assert codes and set(codes) == {200}, (codes, endpoint.output()[-4000:])
    assert Job.objects.get(pk=victim.pk).superseded


def test_a_replica_whose_probe_fails_gets_no_request_until_it_passes_again(
        fast_limits, celery_worker, superuser_api, endpoint, django_user_model, tmp_path):  # noqa: F811
    first, where, auth = _start(superuser_api, django_user_model, endpoint, tmp_path, free_port())
    sick, well = first
    ok = Path(tmp_path) / sick.instance.internal_ip / "ok"
    ok.unlink()
    wait_until(lambda: [j.pk for j in ready("web")] == [well.pk], 30, "the sick replica out of the pool")
    # its `ok` is gone: a request that reached it would be a 404
    assert {requests.get(where + "ok", headers=auth, timeout=10).status_code for _ in range(12)} == {200}
    ok.write_text("ok\n")
    wait_until(lambda: len(ready("web")) == 2, 30, "the replica back in the pool")


class Scaler(Beat):
    """Beat's scaling tick (muster/celery.py), sent to the worker."""

    interval = 0.5

    def tick(self) -> None:
        from engine import tasks

        tasks.scale_services.apply_async(expires=5)


def test_the_first_request_to_a_service_at_zero_waits_for_the_replica_it_brings_up(
        fast_limits, celery_worker, superuser_api, endpoint, django_user_model, tmp_path):  # noqa: F811
    local_project_fleet(size=1)
    scaling = "scaling:\n  metric: rps\n  target: 5\n  scale_up_delay: 0s\n  scale_down_delay: 1h\n"
    answer = superuser_api.post("/api/projects/main/runs/", {"configuration": service_yaml(
        "web", tmp_path, replicas="0..1", extra=scaling, port=free_port())}, format="json")
    assert answer.status_code == 201, answer.json()
    wait_until(lambda: superuser_api.get("/api/projects/main/runs/web/").json()["status"] == "running", 30,
               "running at zero replicas")
    assert not ready("web")
    key = token_for(django_user_model.objects.get(username="root"))
    with Scaler():
        got = requests.get(f"{endpoint.url}/proxy/services/main/web/version",
                           headers={"Authorization": f"Bearer {key}"}, timeout=120)
    assert (got.status_code, got.text.strip()) == (200, "v1")
    assert len(ready("web")) == 1
