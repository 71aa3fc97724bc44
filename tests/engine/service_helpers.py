"""Helpers for the service engine tests: a tiny HTTP service on local hosts, waits on its replicas."""

from __future__ import annotations

import time

from runs.models import Job, Run
from serving.replicas import is_ready
from tests.waiting import patient


def service_yaml(name: str, tmp, replicas: str = "2", extra: str = "", port: int = 8000) -> str:
    """Each replica serves `<tmp>/<its address>/` on its own loopback address: a file `ok` there is
    what its probe asks for, and `pid` its server's process."""
    return f"""type: service
name: {name}
port: {port}
replicas: {replicas}
env:
  - VERSION=v1
commands:
  - mkdir -p {tmp}/$DSTACK_NODE_IP && cd {tmp}/$DSTACK_NODE_IP
  - echo ok > ok && echo $VERSION > version && echo $$ > pid
  - exec python3 -m http.server {port} --bind $DSTACK_NODE_IP
probes:
  - type: http
    url: /ok
    interval: 1s
    timeout: 1s
resources:
  cpu: 1
{extra}"""


def replicas(run_name: str) -> list[Job]:
    run = Run.objects.get(name=run_name)
    return list(run.current_jobs().select_related("instance").order_by("job_num"))


def ready(run_name: str) -> list[Job]:
    return [j for j in replicas(run_name) if is_ready(j)]


def wait_until(check, timeout: float, what: str, every: float = 0.2):
    deadline = time.monotonic() + patient(timeout)
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"not within {patient(timeout)}s: {what} (last: {last!r})\n" + story())


def story() -> str:
    """Every service run's replicas and its last events: what a failed wait shows."""
    from events.models import Event

    lines = []
    for run in Run.objects.all():
        lines.append(f"run {run.name} {run.status} desired={run.desired_replicas} scaling={run.scaling}: {describe(run.name)}")
    lines += [f"  {e.subject}: {e.message}" for e in Event.objects.order_by("-id")[:40]][::-1]
    return "\n".join(lines)


def describe(run_name: str) -> list[tuple]:
    return [(j.job_num, j.replica_num, j.submission_num, j.deployment_num, j.status, j.termination_reason,
             bool(j.ready_at), j.instance and j.instance.internal_ip) for j in replicas(run_name)]


def apply_service(api, conf: str, update: bool = False) -> dict:
    """Submit a service through the REST API (an in-place update with `update`); the run's answer."""
    answer = api.post("/api/projects/main/runs/", {"configuration": conf, **({"update": True} if update else {})},
                      format="json")
    assert answer.status_code in (200, 201), answer.content
    return answer.json()


def local_fleet(count: int):
    """A cluster local fleet of `count` hosts in project main, and the function that ends it."""
    from engine.groups import terminate_fleet_instances
    from instances.services.fleets import create_local_fleet
    from projects.models import Project

    project, _ = Project.objects.get_or_create(name="main")
    fleet = create_local_fleet(project, "local", count, placement="cluster")
    return fleet, lambda: terminate_fleet_instances(fleet)
