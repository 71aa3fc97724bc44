"""A rolling update seen by a client: requests stream through the endpoint process every ~20 ms while
a 2-replica service on three local hosts (one spare) is re-applied with a new version through the
REST API and a real worker rolls it. No request may fail; the answers switch from v1 to v2; the old
deployment's processes are gone at the end."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
import requests

from runs.models import Job, Run
from tests.conftest import token_for
from tests.engine.helpers import Beat, local_project_fleet
from tests.engine.service_helpers import ready, replicas, service_yaml, wait_until
from tests.serving.replicas import free_port
from tests.serving.test_endpoint import endpoint  # noqa: F401 (the fixture)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


class Client(threading.Thread):
    """Sends GET <url> every `every` seconds until stopped, keeping (status or error, body) of each."""

    def __init__(self, url: str, headers: dict, every: float = 0.02):
        super().__init__(daemon=True)
        self.url, self.headers, self.every = url, headers, every
        self.answers: list[tuple[int | str, str]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        with requests.Session() as session:
            while not self.stop.wait(self.every):
                try:
                    got = session.get(self.url, headers=self.headers, timeout=10)
                    self.answers.append((got.status_code, got.text.strip()))
                except requests.RequestException as e:
                    self.answers.append((type(e).__name__, str(e)))

    def finish(self) -> list[tuple[int | str, str]]:
        """Stops sending and returns every answer's body, after checking that none failed."""
        self.stop.set()
        self.join(20)
        failed = [a for a in self.answers if a[0] != 200]
        assert not failed, f"{len(failed)} of {len(self.answers)} requests failed: {failed[:10]}"
        return [text for _, text in self.answers]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _pid(tmp_path: Path, job: Job) -> int:
    return int((tmp_path / job.instance.internal_ip / "pid").read_text())


def test_a_rolling_update_under_steady_load_fails_no_request_and_leaves_only_the_new_version(
        fast_limits, settings, celery_worker, superuser_api, endpoint, django_user_model, tmp_path):  # noqa: F811
    settings.MUSTER = {**settings.MUSTER, "DRAIN_DELAY": 1.0}
    local_project_fleet(size=3)
    port = free_port()
    conf = service_yaml("web", tmp_path, port=port)
    answer = superuser_api.post("/api/projects/main/runs/", {"configuration": conf}, format="json")
    assert answer.status_code == 201, answer.json()
    old = wait_until(lambda: (r := ready("web")) and len(r) == 2 and r, 60, "two replicas ready")
    old_pids = [_pid(tmp_path, j) for j in old]
    key = token_for(django_user_model.objects.get(username="root"))
    client = Client(f"{endpoint.url}/proxy/services/main/web/version", {"Authorization": f"Bearer {key}"})
    client.start()
    try:
        wait_until(lambda: len(client.answers) >= 10, 30, "the client's first answers")
        with Beat():
            update = superuser_api.post("/api/projects/main/runs/", {"configuration": conf.replace(
                "VERSION=v1", "VERSION=v2"), "update": True}, format="json")
            assert update.status_code in (200, 201), update.content
            assert Run.objects.get(name="web").deployment_num == 1

            def rolled() -> bool:
                now = replicas("web")
                return (len(now) == 2 and all(j.deployment_num == 1 for j in now) and len(ready("web")) == 2
                        and not Job.objects.filter(run__name="web", deployment_num=0, status="running").exists())
            wait_until(rolled, 120, "both replicas of deployment 1 ready, none of deployment 0 running")
            seen = len(client.answers)
            wait_until(lambda: len(client.answers) >= seen + 20, 30, "answers after the rollout")
    finally:
        client.stop.set()
    versions = client.finish()
    assert versions[0] == "v1" and set(versions) == {"v1", "v2"}, sorted(set(versions))
    assert versions[seen:] == ["v2"] * (len(versions) - seen), "only v2 answers once the rollout ended"
    assert not any(_alive(pid) for pid in old_pids), "the old deployment's processes are gone"
    for job in replicas("web"):
        assert (tmp_path / job.instance.internal_ip / "version").read_text().strip() == "v2"
        assert _alive(_pid(tmp_path, job))
