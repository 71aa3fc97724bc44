"""A routed service's blue/green update seen by a client: requests stream through the endpoint
process every ~20 ms while a service with a router group and a worker group on four local hosts is
re-applied through the REST API and a real worker rolls it. No request fails, the endpoint's routing
table never holds two deployments, the answers switch from v1 to v2 once; a further update whose
workers never become ready rolls back while v2 serves on."""

from __future__ import annotations

from pathlib import Path

import pytest

from events.models import Event
from runs.models import Job, Run
from serving import routes
from tests.conftest import token_for
from tests.engine.helpers import BackgroundLoop, Beat, local_project_fleet
from tests.engine.service_helpers import ready, replicas, wait_until
from tests.serving.replicas import free_port
from tests.serving.test_endpoint import endpoint  # noqa: F401 (the fixture)
from tests.serving.test_rollout_under_load import Client, _alive, _pid

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _group(name: str, tmp: Path, port: int, extra: str = "", ok: str = "echo ok > ok && ") -> str:
    return f"""  - name: {name}
    replicas: 1
    resources: {{cpu: 1}}
{extra}    commands:
      - mkdir -p {tmp}/$DSTACK_NODE_IP && cd {tmp}/$DSTACK_NODE_IP
      - {ok}echo $VERSION > version && echo $$ > pid
      - exec python3 -m http.server {port} --bind $DSTACK_NODE_IP
"""


def routed_yaml(tmp: Path, port: int, version: str, worker_ok: bool = True) -> str:
    """A router and a worker, each serving `<tmp>/<its address>/` (`version`, and `ok` for the
    probe: a worker without it never becomes ready)."""
    # a router whose worker list Muster does not keep (not smg): the endpoint's side of the update
    # alone; tests/serving_pd/test_pd_rollout.py has smg's
    router = _group("router", tmp, port, "    router: {type: dynamo}\n")
    worker = _group("worker", tmp, port, "    ready_timeout: 4s\n", "echo ok > ok && " if worker_ok else "rm -f ok && ")
    return f"""type: service
name: pd
port: {port}
env:
  - VERSION={version}
probes:
  - type: http
    url: /ok
    interval: 1s
    timeout: 1s
groups:
{router}{worker}"""


class RoutedDeployments(BackgroundLoop):
    """The deployments of the replicas in the endpoint's routing table, as it reads them."""

    interval = 0.05

    def __init__(self, run_id: int):
        super().__init__()
        self.run_id, self.seen = run_id, []

    def tick(self) -> None:
        service = routes.service_by_run(self.run_id)
        jobs = [r.job_id for r in service.replicas] if service else []
        self.seen.append(frozenset(Job.objects.filter(pk__in=jobs).values_list("deployment_num", flat=True)))


def _update(api, conf: str) -> None:
    answer = api.post("/api/projects/main/runs/", {"configuration": conf, "update": True}, format="json")
    assert answer.status_code in (200, 201), answer.content


def test_a_routed_service_switches_deployments_in_one_step_under_load_and_a_failed_rollout_rolls_back(
        fast_limits, settings, celery_worker, superuser_api, endpoint, django_user_model, tmp_path):  # noqa: F811
    settings.MUSTER = {**settings.MUSTER, "DRAIN_DELAY": 1.0}
    local_project_fleet(size=4)
    port = free_port()
    answer = superuser_api.post("/api/projects/main/runs/", {"configuration": routed_yaml(tmp_path, port, "v1")},
                                format="json")
    assert answer.status_code == 201, answer.json()
    run = Run.objects.get(name="pd")
    wait_until(lambda: len(ready("pd")) == 2 and routes.service_by_run(run.pk).replicas, 60,
               "the router and the worker of deployment 0 ready")
    old_pids = [_pid(tmp_path, j) for j in replicas("pd")]
    key = token_for(django_user_model.objects.get(username="root"))
    client = Client(f"{endpoint.url}/proxy/services/main/pd/version", {"Authorization": f"Bearer {key}"})
    client.start()
    try:
        wait_until(lambda: len(client.answers) >= 10, 30, "the client's first answers")
        with Beat(), RoutedDeployments(run.pk) as routed:
            _update(superuser_api, routed_yaml(tmp_path, port, "v2"))

            def switched() -> bool:
                now = replicas("pd")
                return (Run.objects.get(pk=run.pk).serving_deployment == 1 and len(now) == 2
                        and all(j.deployment_num == 1 for j in now)
                        and not Job.objects.filter(run=run, deployment_num=0, status="running").exists())
            wait_until(switched, 120, "deployment 1 serves, deployment 0 stopped")
            seen = len(client.answers)
            wait_until(lambda: len(client.answers) >= seen + 20, 30, "answers after the switch")

            _update(superuser_api, routed_yaml(tmp_path, port, "v3", worker_ok=False))
            wait_until(lambda: (r := Run.objects.get(pk=run.pk)).deployment_num == 1 and not r.rollout, 90,
                       "the rollout to deployment 2 rolled back")
            wait_until(lambda: not Job.objects.filter(run=run, deployment_num=2, superseded=False).exists(), 60,
                       "deployment 2's replicas removed")
            after = len(client.answers)
            wait_until(lambda: len(client.answers) >= after + 20, 30, "answers after the rollback")
    finally:
        client.stop.set()
    versions = client.finish()
    switch = versions.index("v2")
    assert set(versions[:switch]) == {"v1"} and set(versions[switch:]) == {"v2"}, \
        "v1 until the switch, v2 after it, nothing of v3: never two deployments at once"
    assert all(len(deployments) <= 1 for deployments in routed.seen), sorted(set(routed.seen), key=len)
    assert {frozenset({0}), frozenset({1})} <= set(routed.seen)
    assert not any(_alive(pid) for pid in old_pids), "deployment 0's processes are gone"
    conf = Run.objects.get(pk=run.pk)
    assert (conf.serving_deployment, conf.desired_replicas) == (1, {"router": 1, "worker": 1})
    assert "VERSION=v2" in conf.submitted_text, "the configuration is deployment 1's again"
    said = list(Event.objects.filter(run=run).order_by("id").values_list("message", flat=True))
    assert any(m.startswith("switched to deployment 1") for m in said), said
    assert any("rollout to deployment 2 failed" in m and "rolled back to deployment 1" in m for m in said), said
