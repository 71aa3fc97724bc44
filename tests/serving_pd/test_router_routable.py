"""A PD service's router enters the endpoint's pool only once it can serve: smg answers 503 until the
router sync has given it its workers, so requests sent through the endpoint without a pause from the
moment the service is applied, and across a router's kill and its replacement, get 200 or the
endpoint's own answers, never smg's 503 (told apart by the body: the endpoint's is its `detail`)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest
import requests

from tests.conftest import token_for
from tests.engine.helpers import Beat, local_project_fleet
from tests.engine.service_helpers import ready, wait_until
from tests.serving.replicas import free_port
from tests.serving.test_endpoint import endpoint  # noqa: F401 (the fixture)
from tests.serving_pd.test_pd_service import pd_yaml

pytestmark = [pytest.mark.smg, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

NO_REPLICA = "service main/pd has no ready replica"
# the endpoint's own 502s: the router it sent to was killed under the request (refused, closed, cut off)
ROUTER_GONE = ("every ready replica of the service refused", "the replica refused the connection",
               "the replica closed the connection", "the replica's answer broke off", "forwarding to the replica failed")


class Client(threading.Thread):
    """POST /generate through the endpoint, one after the other, until stopped; every answer kept."""

    def __init__(self, url: str, auth: dict):
        super().__init__(daemon=True)
        self.url, self.auth, self.stopped, self.answers = url, auth, threading.Event(), []
        self.phase = "start"

    def run(self) -> None:
        while not self.stopped.is_set():
            try:
                got = requests.post(self.url, json={"text": "hi"}, headers=self.auth, timeout=30)
                self.answers.append((self.phase, got.status_code, got.text))
            except requests.RequestException as exc:
                self.answers.append((self.phase, 0, repr(exc)))
            time.sleep(0.02)

    def stop(self) -> None:
        self.stopped.set()
        self.join(60)


def _detail(text: str) -> str:
    try:
        detail = json.loads(text).get("detail")
    except (ValueError, AttributeError):
        return ""
    return detail if isinstance(detail, str) else ""


def _foreign(answers: list, phase: str, kill: bool = False) -> list:
    """The answers of `phase` that are neither 200 nor the endpoint's own."""
    def own(status: int, text: str) -> bool:
        if status == 503:
            return _detail(text).startswith(NO_REPLICA)
        return kill and status == 502 and _detail(text).startswith(ROUTER_GONE)
    return [(s, t[:200]) for p, s, t in answers if p == phase and s != 200 and not own(s, t)]


def _router():
    return next((j for j in ready("pd") if j.node_group_name == "router"), None)


def test_requests_from_the_apply_on_and_across_a_router_restart_never_get_smgs_503(
        fast_limits, celery_worker, superuser_api, endpoint, django_user_model, tmp_path):  # noqa: F811
    local_project_fleet(size=3)
    port = free_port()
    key = token_for(django_user_model.objects.get(username="root"))
    client = Client(f"{endpoint.url}/proxy/services/main/pd/generate", {"Authorization": f"Bearer {key}"})
    answer = superuser_api.post("/api/projects/main/runs/", {"configuration": pd_yaml("pd", port, tmp_path)},
                                format="json")
    assert answer.status_code == 201, answer.json()
    client.start()
    try:
        with Beat():
            wait_until(lambda: any(p == "start" and s == 200 for p, s, _ in client.answers), 120,
                       "a request answered through smg")
            for _ in range(20):  # and it goes on serving
                time.sleep(0.05)
            old = _router()
            client.phase = "kill"
            os.kill(int((tmp_path / f"{old.instance.internal_ip}.pid").read_text()), signal.SIGKILL)
            wait_until(lambda: (j := _router()) is not None and j.pk != old.pk, 90, "the router replaced and ready")
            wait_until(lambda: any(p == "kill" and s == 200 for p, s, _ in client.answers), 60,
                       "a request answered through the new router")
            time.sleep(1)
    finally:
        client.stop()
    starting = [(s, _detail(t)) for p, s, t in client.answers if p == "start" and s != 200]
    print(f"{len(client.answers)} requests; before the first 200: {len(starting)} answered {set(starting)}")
    assert starting and starting[0][0] == 503, "the service applied, no replica yet: the endpoint's 503"
    assert not _foreign(client.answers, "start"), _foreign(client.answers, "start")[:5]
    assert not _foreign(client.answers, "kill", kill=True), _foreign(client.answers, "kill", kill=True)[:5]
    killed = [s for p, s, _ in client.answers if p == "kill"]
    assert killed[-1] == 200, "serving again after the router's replacement"
