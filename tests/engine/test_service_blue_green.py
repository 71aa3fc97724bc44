"""A routed service's blue/green update (engine/replicas/revisions.py) in the test process, no worker:
rows in, rows out. The replicas' running and readiness are written as the engine's steps would."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from engine import processing
from events.models import Event
from instances.models import Instance
from runs.models import Job, Run
from runs.services.submission import submit_run
from serving import routes
from tests.engine.helpers import local_project_fleet

pytestmark = pytest.mark.django_db(transaction=True)

ROUTED = """type: service
name: pd
port: 8000
env:
  - VERSION=v1
groups:
  - name: router
    router: {type: dynamo}
    replicas: 1
    commands: [python3 -m http.server 8000]
  - name: worker
    replicas: 2
    commands: [python3 -m http.server 8000]
"""


def _apply(fleet, text: str, update: bool = False) -> Run:
    return submit_run(fleet.project, None, {"configuration": text, **({"update": True} if update else {})})


def _live(run: Run, deployment: int | None = None) -> list[Job]:
    jobs = Job.objects.filter(run=run, superseded=False).order_by("job_num")
    return [j for j in jobs if deployment is None or j.deployment_num == deployment]


def _serve(jobs: list[Job]) -> None:
    """The jobs run and their probes passed (as the engine's running and readiness steps write it)."""
    now = timezone.now()
    hosts = list(Instance.objects.order_by("id"))
    for job in jobs:  # any host: the routes want an address, nothing here reaches it
        Job.objects.filter(pk=job.pk).update(status="running", ready_at=now, first_ready_at=now,
                                             instance=hosts[job.job_num % len(hosts)])


def _derive(run: Run) -> Run:
    assert processing.process_run(run.pk)
    return Run.objects.get(pk=run.pk)


def _said(run: Run) -> list[str]:
    return list(Event.objects.filter(run=run).order_by("id").values_list("message", flat=True))


def _routed_jobs(run: Run) -> set[int]:
    service = routes.service_by_run(run.pk)
    return {r.job_id for r in service.replicas} if service else set()


def _serves(run: Run, jobs: set[int]) -> bool:
    """The endpoint sends to `jobs`' router and to nothing outside `jobs` (to their router only, once
    the endpoint sends to a routed service's routers only)."""
    routed = _routed_jobs(run)
    router = Job.objects.filter(pk__in=jobs, node_group_name="router").values_list("pk", flat=True)
    return bool(routed) and routed <= jobs and set(router) <= routed


@pytest.fixture
def serving_pd(sent):
    """A routed service of deployment 0, its router and two workers serving."""
    fleet = local_project_fleet(size=6)
    run = _apply(fleet, ROUTED)
    run = _derive(run)
    _serve(_live(run))
    return fleet, _derive(run)


def test_the_new_deployment_comes_up_beside_the_old_and_the_endpoint_switches_in_one_step(serving_pd):
    fleet, run = serving_pd
    old = {j.pk for j in _live(run)}
    assert _serves(run, old)
    run = _apply(fleet, ROUTED.replace("VERSION=v1", "VERSION=v2"), update=True)
    assert (run.deployment_num, run.serving_deployment) == (1, 0)
    assert run.rollout["desired_replicas"] == {"router": 1, "worker": 2}
    run = _derive(run)
    new = _live(run, 1)
    assert sorted(j.node_group_name for j in new) == ["router", "worker", "worker"], "every group at its count"
    assert all(j.drain_at is None for j in _live(run, 0)), "the old deployment serves on untouched"
    _serve(new[:2])  # the router and one worker: not all of it yet
    run = _derive(run)
    assert run.serving_deployment == 0 and _serves(run, old)
    _serve(new)
    run = _derive(run)
    assert (run.serving_deployment, run.rollout) == (1, {})
    assert _serves(run, {j.pk for j in new}), "the endpoint sends to deployment 1 only"
    drained = _live(run, 0)
    assert drained and all(j.drain_at is not None and j.ready_at is None for j in drained), \
        "the old deployment is out of the pool at once, stopped after the drain delay"
    said = _said(run)
    assert any(m.startswith("switched to deployment 1") for m in said), said
    assert sum("deployment 1 serves now, deployment 0 is removed" in m for m in said) == 3, said


def test_a_replica_of_the_new_deployment_that_fails_rolls_back_and_the_old_one_serves_on(serving_pd):
    fleet, run = serving_pd
    old = {j.pk for j in _live(run)}
    old_conf = run.configuration
    run = _apply(fleet, ROUTED.replace("VERSION=v1", "VERSION=v2").replace("replicas: 2", "replicas: 3"),
                 update=True)
    run = _derive(run)
    new = _live(run, 1)
    assert len(new) == 4
    _serve(new[:3])
    Job.objects.filter(pk=new[3].pk).update(status="terminated", termination_reason="waiting_ready_limit_exceeded",
                                            termination_message="not ready within ready_timeout 60s")
    run = _derive(run)
    assert (run.deployment_num, run.serving_deployment, run.rollout) == (0, 0, {})
    assert run.configuration == old_conf and run.desired_replicas == {"router": 1, "worker": 2}
    assert "VERSION=v1" in run.submitted_text
    assert {j.pk for j in _live(run, 0)} == old and all(j.drain_at is None for j in _live(run, 0))
    assert _serves(run, old), "the old deployment served throughout"
    rolled_back = _live(run, 1)
    assert rolled_back and all(j.drain_at is not None for j in rolled_back), "deployment 1's replicas are removed"
    said = _said(run)
    assert any("rollout to deployment 1 failed" in m and "waiting_ready_limit_exceeded" in m
               and "rolled back to deployment 0" in m for m in said), said
    assert Run.objects.get(pk=run.pk).status == "running"
    # the next update does not reuse the rolled-back number
    run = _apply(fleet, ROUTED.replace("VERSION=v1", "VERSION=v3"), update=True)
    assert (run.deployment_num, run.serving_deployment) == (2, 0)


def test_a_second_apply_during_a_rollout_supersedes_it(serving_pd):
    fleet, run = serving_pd
    old = {j.pk for j in _live(run)}
    _apply(fleet, ROUTED.replace("VERSION=v1", "VERSION=v2"), update=True)
    run = _derive(run)
    first = _live(run, 1)
    assert len(first) == 3
    run = _apply(fleet, ROUTED.replace("VERSION=v1", "VERSION=v3"), update=True)
    assert (run.deployment_num, run.serving_deployment) == (2, 0)
    assert "VERSION=v1" in run.rollout["submitted_text"], "a rollback would still restore what serves"
    run = _derive(run)
    assert all(Job.objects.get(pk=j.pk).drain_at is not None for j in first), "the superseded rollout is removed"
    second = _live(run, 2)
    assert len(second) == 3 and _serves(run, old)
    _serve(second)
    run = _derive(run)
    assert run.serving_deployment == 2 and _serves(run, {j.pk for j in second})
    said = _said(run)
    assert any("supersedes the rollout to deployment 1" in m for m in said), said
    assert sum("deployment 1 was superseded by deployment 2" in m for m in said) == 3, said


def test_a_service_without_a_router_is_still_rolled_one_replica_at_a_time(sent):
    fleet = local_project_fleet(size=4)
    plain = "type: service\nname: web\nport: 8000\nreplicas: 2\nenv: [VERSION=v1]\n" \
            "commands: [python3 -m http.server 8000]\n"
    run = _derive(_apply(fleet, plain))
    _serve(_live(run))
    run = _derive(run)
    run = _apply(fleet, plain.replace("v1", "v2"), update=True)
    assert (run.deployment_num, run.serving_deployment, run.rollout) == (1, 1, {})
    run = _derive(run)
    assert len(_live(run, 1)) == 1, "the surge of one"


def test_a_rollout_short_of_hosts_is_rolled_back_at_its_deadline_saying_so(serving_pd):
    fleet, run = serving_pd
    old = {j.pk for j in _live(run)}
    run = _apply(fleet, ROUTED.replace("VERSION=v1", "VERSION=v2").replace(
        "    replicas: 2\n", "    replicas: 2\n    ready_timeout: 60s\n"), update=True)
    run = _derive(run)
    new = _live(run, 1)
    _serve(new[:2])
    Job.objects.filter(pk=new[2].pk).update(waiting_for="a host of fleet local")
    run = _derive(run)
    assert run.deployment_num == 1 and run.next_retry_at is not None, "looked at again at the deadline"
    # the router has the default 30 min: the deadline is the update's time plus that
    started = timezone.now() - timedelta(minutes=31)
    Run.objects.filter(pk=run.pk).update(rollout={**run.rollout, "started_at": started.isoformat()})
    run = _derive(run)
    assert (run.deployment_num, run.serving_deployment, run.rollout) == (0, 0, {})
    assert _serves(run, old)
    assert all(j.drain_at is not None for j in _live(run, 1))
    said = _said(run)
    assert any("rollout to deployment 1 failed (deployment 1 not ready within the longest ready_timeout" in m
               and "1 of its replicas waited for a host (a host of fleet local)" in m for m in said), said


def test_a_serving_replica_that_ends_during_a_rollout_is_not_replaced_and_a_rollback_restores_the_count(serving_pd):
    # a replica starts with the run's configuration, which is the new deployment's during a rollout
    fleet, run = serving_pd
    _apply(fleet, ROUTED.replace("VERSION=v1", "VERSION=v2"), update=True)
    run = _derive(run)
    worker = next(j for j in _live(run, 0) if j.node_group_name == "worker")
    Job.objects.filter(pk=worker.pk).update(status="done", status_changed_at=timezone.now() - timedelta(minutes=1))
    run = _derive(run)
    assert Job.objects.get(pk=worker.pk).superseded and len(_live(run, 0)) == 2
    new = _live(run, 1)
    assert len(new) == 3 and len({(j.node_group_name, j.replica_num) for j in _live(run)}) == 5, \
        "a replica number is one live replica's, whatever its deployment"
    Job.objects.filter(pk=new[0].pk).update(status="failed", termination_reason="process_exited_with_error")
    run = _derive(run)
    assert run.deployment_num == 0 and run.configuration["env"] == {"VERSION": "v1"}
    back = [j for j in _live(run, 0) if j.node_group_name == "worker" and j.drain_at is None]
    assert len(back) == 2, "the restored deployment is brought back to its count, with its own configuration"


def _stopped(jobs: list[Job]) -> None:
    """Drained replicas that have stopped (as the stop after the drain delay ends them)."""
    Job.objects.filter(pk__in=[j.pk for j in jobs]).update(status="terminated", termination_reason="terminated_by_server")


def test_with_max_surge_the_old_workers_shrink_as_the_new_ones_grow_and_the_switch_is_still_one_step(sent):
    fleet = local_project_fleet(size=4)
    surged = ROUTED.replace("groups:", "rollout:\n  max_surge: 1\ngroups:")
    run = _derive(_apply(fleet, surged))
    _serve(_live(run))
    run = _derive(run)
    old = {j.pk for j in _live(run)}
    run = _derive(_apply(fleet, surged.replace("VERSION=v1", "VERSION=v2"), update=True))
    new = _live(run, 1)
    assert [j.node_group_name for j in new] == ["router"], "the router first, on the one host of the surge"
    shrunk = [j for j in _live(run, 0) if j.drain_at is not None]
    assert [j.node_group_name for j in shrunk] == ["worker"], "then one old worker leaves to free a host"
    assert run.serving_deployment == 0 and _serves(run, old - {shrunk[0].pk})
    run = _derive(run)
    assert len(_live(run, 1)) == 1, "no new worker while the old one's host is busy"
    _stopped(shrunk)
    run = _derive(run)
    new = _live(run, 1)
    assert sorted(j.node_group_name for j in new) == ["router", "worker"]
    assert len(_live(run)) == 4, "never more than the old count plus max_surge"
    assert all(j.drain_at is None for j in _live(run, 0)), "the last old worker stays: the old deployment serves"
    _serve(new)
    run = _derive(run)
    assert run.serving_deployment == 1 and _serves(run, {j.pk for j in new}), \
        "switched with one worker of each: the rest come once the old deployment stopped"
    _stopped(_live(run, 0))
    run = _derive(run)
    assert sorted(j.node_group_name for j in _live(run, 1)) == ["router", "worker", "worker"]
    said = _said(run)
    assert any("within max_surge 1: deployment 0 shrinks as it grows" in m for m in said), said


def test_rollout_max_surge_is_checked_and_warned_about_without_a_router(sent):
    from runs.configuration.errors import ConfigurationError
    from runs.configuration.service import parse_service_configuration

    doc = {"type": "service", "name": "x", "port": 80, "rollout": {"max_surge": 0}, "commands": ["x"]}
    with pytest.raises(ConfigurationError) as bad:
        parse_service_configuration(doc)
    assert "max_surge must be a whole number of replicas, at least 1" in str(bad.value)
    conf = parse_service_configuration({**doc, "rollout": {"max_surge": 2}})
    assert conf.rollout.max_surge == 2
    assert any(w["field"] == "rollout" and "router" in w["message"] for w in conf.warnings)


def test_two_applies_at_once_are_applied_one_after_the_other_and_the_second_supersedes(serving_pd):
    import threading

    from django.db import connection

    fleet, run = serving_pd
    results: dict[str, int] = {}
    start = threading.Barrier(2)

    def apply(version: str) -> None:
        try:
            start.wait(5)
            results[version] = _apply(fleet, ROUTED.replace("VERSION=v1", f"VERSION={version}"),
                                      update=True).deployment_num
        finally:
            connection.close()

    threads = [threading.Thread(target=apply, args=(v,)) for v in ("v2", "v3")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert sorted(results.values()) == [1, 2], results
    run = Run.objects.get(pk=run.pk)
    last = max(results, key=results.get)
    assert (run.deployment_num, run.serving_deployment) == (2, 0)
    assert run.configuration["env"] == {"VERSION": last}, "the later apply's configuration is the one rolled out"
    assert "VERSION=v1" in run.rollout["submitted_text"], "a rollback restores what serves, not the superseded one"
    run = _derive(run)
    assert len(_live(run, 2)) == 3 and not _live(run, 1)


def test_the_switch_waits_for_the_new_smg_router_to_list_its_workers_as_ready(sent):
    """smg takes an added worker in the background: the endpoint switches only once the new router
    itself lists every worker of its deployment as ready, and the router sync saw it so (a stand-in
    router per deployment answers GET /workers; a router is routable once a sync saw it serve)."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from engine import router_sync
    from serving.router_sync import JOB_LABEL, worker_url
    from tests.serving.replicas import free_port

    listings: dict[str, list[dict]] = {}

    class Router(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            body = json.dumps({"workers": listings[self.server.server_address[0]]}).encode()
            self.send_response(200 if self.path == "/workers" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    fleet = local_project_fleet(size=6)
    port = free_port()
    smg = ROUTED.replace("router: {type: dynamo}", "router: {type: smg}").replace("port: 8000", f"port: {port}")
    servers = []

    def router_of(jobs) -> tuple[list[Job], list[dict]]:
        """A stand-in router for `jobs`' router, and its workers as it lists them (healthy, ready)."""
        jobs = [Job.objects.select_related("instance").get(pk=j.pk) for j in jobs]
        router = next(j for j in jobs if j.node_group_name == "router")
        workers = [j for j in jobs if j.node_group_name == "worker"]
        listings[router.instance.internal_ip] = [
            {"url": worker_url(w, port), "is_healthy": True, "status": "ready", "labels": {JOB_LABEL: str(w.pk)}}
            for w in workers]
        servers.append(ThreadingHTTPServer((router.instance.internal_ip, port), Router))
        threading.Thread(target=servers[-1].serve_forever, daemon=True).start()
        return workers, listings[router.instance.internal_ip]

    run = _derive(_apply(fleet, smg))
    _serve(_live(run))
    try:
        router_of(_live(run))
        router_sync.sync_routers(run.pk)  # deployment 0's router serves: it gets the endpoint's traffic
        run = _derive(run)
        old = {j.pk for j in _live(run)}
        assert _serves(run, old)
        run = _derive(_apply(fleet, smg.replace("VERSION=v1", "VERSION=v2"), update=True))
        new = _live(run, 1)
        _serve(new)
        workers, listing = router_of(new)
        listing[1]["status"] = "pending"
        router_sync.sync_routers(run.pk)
        run = _derive(run)
        assert run.serving_deployment == 0 and _serves(run, old), "one worker not ready in the router yet"
        assert run.next_retry_at is not None, "looked at again soon"
        listing[1]["status"] = "ready"
        run = _derive(run)
        assert run.serving_deployment == 0, "the router lists both now, but no sync saw it serve yet"
        router_sync.sync_routers(run.pk)
        run = _derive(run)
        assert run.serving_deployment == 1 and _serves(run, {j.pk for j in new})
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


def test_an_update_of_a_routed_service_that_only_changes_replica_counts_scales_it_in_place(serving_pd):
    fleet, run = serving_pd
    old = {j.pk for j in _live(run)}
    run = _apply(fleet, ROUTED.replace("replicas: 2", "replicas: 1"), update=True)
    assert (run.deployment_num, run.serving_deployment, run.desired_replicas) == (0, 0, {"router": 1, "worker": 1})
    run = _derive(run)
    assert len([j for j in _live(run) if j.drain_at is None]) == 2 and {j.pk for j in _live(run)} == old
    assert any("only the replica counts changed" in m and "scaled in place" in m for m in _said(run)), _said(run)
    run = _apply(fleet, ROUTED.replace("VERSION=v1", "VERSION=v2"), update=True)
    assert (run.deployment_num, run.serving_deployment) == (1, 0), "anything else is a new deployment"
