"""A PD service's blue/green update with the real `smg` and stand-in workers on local hosts,
through the REST API with a real worker and the endpoint process: under steady load no request
fails, and no router ever lists a worker of another deployment (each router's list polled from smg
throughout the update)."""

from __future__ import annotations

import threading
import time

import pytest
import requests

from runs.models import Job, Run
from serving.replicas import is_ready
from tests.conftest import token_for
from tests.engine.helpers import Beat, local_project_fleet
from tests.engine.service_helpers import wait_until
from tests.serving.replicas import free_port
from tests.serving.test_endpoint import endpoint  # noqa: F401 (the fixture)
from tests.serving_pd.processes import workers
from tests.serving_pd.test_pd_service import pd_yaml

pytestmark = [pytest.mark.smg, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


class Load(threading.Thread):
    """POST /generate through the endpoint every `every` seconds, keeping each answer's status."""

    def __init__(self, url: str, headers: dict, every: float = 0.05):
        super().__init__(daemon=True)
        self.url, self.headers, self.every = url, headers, every
        self.answers: list[int | str] = []
        self.failures: list[tuple[float, object, str]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        with requests.Session() as session:
            while not self.stop.wait(self.every):
                try:
                    got = session.post(self.url, json={"text": "hi"}, headers=self.headers, timeout=15)
                    self.answers.append(got.status_code)
                    if got.status_code != 200:
                        self.failures.append((time.time(), got.status_code, got.text[:300]))
                except requests.RequestException as e:
                    self.answers.append(type(e).__name__)
                    self.failures.append((time.time(), type(e).__name__, str(e)[:300]))


class Lists(threading.Thread):
    """Every ready router's worker list, read from smg, each listed worker mapped to its deployment."""

    def __init__(self, run_id: int, port: int):
        super().__init__(daemon=True)
        self.run_id, self.port = run_id, port
        self.mixed: list[tuple] = []
        self.seen: set[tuple[int, frozenset]] = set()
        self.stop = threading.Event()

    def run(self) -> None:
        from django.db import connection

        try:
            while not self.stop.wait(0.1):
                self.look()
        finally:
            connection.close()

    def look(self) -> None:
        jobs = [j for j in Job.objects.filter(run_id=self.run_id, superseded=False).select_related("instance")
                if j.instance is not None]
        by_url = {f"http://{j.instance.internal_ip}:{self.port}": j.deployment_num for j in jobs}
        for router in [j for j in jobs if j.node_group_name == "router" and is_ready(j)]:
            try:
                listed = workers(router.instance.internal_ip, self.port)
            except (OSError, ValueError):
                continue  # a router stopping
            deployments = frozenset(by_url.get(w.get("url"), -1) for w in listed)
            self.seen.add((router.deployment_num, deployments))
            if deployments - {router.deployment_num}:
                self.mixed.append((router.deployment_num, sorted(w.get("url") for w in listed)))


def test_a_pd_service_update_under_load_fails_no_request_and_no_router_lists_two_deployments(
        fast_limits, settings, celery_worker, superuser_api, endpoint, django_user_model, tmp_path):  # noqa: F811
    settings.MUSTER = {**settings.MUSTER, "DRAIN_DELAY": 1.0}
    local_project_fleet(size=6)
    port = free_port()
    conf = pd_yaml("pd", port, tmp_path)
    answer = superuser_api.post("/api/projects/main/runs/", {"configuration": conf}, format="json")
    assert answer.status_code == 201, answer.json()
    run = Run.objects.get(name="pd")
    lists = Lists(run.pk, port)
    key = token_for(django_user_model.objects.get(username="root"))
    url, auth = f"{endpoint.url}/proxy/services/main/pd/generate", {"Authorization": f"Bearer {key}"}
    wait_until(lambda: requests.post(url, json={"text": "hi"}, headers=auth, timeout=15).status_code == 200, 90,
               "a request through smg of deployment 0, its prefill and its decode")
    lists.look()
    assert (0, frozenset({0})) in lists.seen, lists.seen
    load = Load(url, auth)
    load.start()
    lists.start()
    try:
        wait_until(lambda: len(load.answers) >= 10, 30, "the first answers")
        with Beat():
            update = superuser_api.post("/api/projects/main/runs/", {
                "configuration": conf.replace("type: service", "type: service\nenv:\n  - VERSION=v2"),
                "update": True}, format="json")
            assert update.status_code in (200, 201), update.content

            def switched() -> bool:
                return (Run.objects.get(pk=run.pk).serving_deployment == 1 and not Job.objects.filter(
                    run=run, deployment_num=0, status__in=["running", "terminating"]).exists())
            wait_until(switched, 120, "deployment 1 serves, deployment 0 stopped")
            wait_until(lambda: (1, frozenset({1})) in lists.seen, 30, "smg of deployment 1 lists its workers")
            seen = len(load.answers)
            wait_until(lambda: len(load.answers) >= seen + 10, 30, "answers after the switch")
    finally:
        load.stop.set()
        lists.stop.set()
        load.join(20)
        lists.join(20)
    failed = [a for a in load.answers if a != 200]
    from events.models import Event
    said = [(e.created.timestamp(), e.subject, e.message[:160]) for e in Event.objects.filter(run=run).order_by("id")]
    assert not failed, f"{len(failed)} of {len(load.answers)} requests failed: {load.failures[:10]}\n" + "\n".join(
        str(e) for e in said)
    assert not lists.mixed, f"a router listed workers of another deployment: {lists.mixed[:5]}"
    assert (0, frozenset({0})) in lists.seen and (1, frozenset({1})) in lists.seen, lists.seen
