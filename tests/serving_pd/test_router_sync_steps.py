"""sync_routers as process -> outcome -> guarded apply, run in the test process against a real smg
and stand-in workers on loopback addresses (no Celery worker): which runs it takes, what it leaves
in smg and in its row, that a stale lease drops its outcome, that it does nothing while another
worker holds the row (step_case marks: tests/test_step_cases.py); and the failures it reports
once: a router that refuses the worker API, a worker the router does not take."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from django.utils import timezone

from engine import claims, router_sync
from events.models import Event
from instances.models import Instance
from projects.models import Project
from runs.models import Job, Run
from serving.models import RouterSync
from tests.engine.outcome_helpers import around_body, steal
from tests.serving_pd.processes import Processes, address, free_port, listed, post, wait_port
from tests.waiting import wait_until

pytestmark = [pytest.mark.smg, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def procs(tmp_path):
    found = Processes(tmp_path)
    yield found
    found.stop()


def _service(port: int, groups: list[dict], name: str = "pd") -> tuple[Run, dict[str, Job]]:
    project, _ = Project.objects.get_or_create(name="main")
    conf = {"type": "service", "name": name, "port": port, "auth": False,
            "groups": [{"replicas": {"min": 1, "max": 1}, **g} for g in groups]}
    run = Run.objects.create(project=project, name=name, configuration=conf, status="running")
    jobs = {}
    for num, group in enumerate(groups):
        host = address(10 + num)
        instance = Instance.objects.create(project=project, name=f"{name}-{num}", backend="local", status="busy",
                                           hostname=host, internal_ip=host)
        jobs[group["name"]] = Job.objects.create(run=run, job_num=num, node_group_name=group["name"], spec={},
                                                 status="running", instance=instance, ready_at=timezone.now())
    return run, jobs


PD = [{"name": "router", "router": "smg"}, {"name": "prefill"}, {"name": "decode"}]


def _pd(procs, port: int, **kwargs) -> tuple[Run, dict[str, Job]]:
    run, jobs = _service(port, PD, **kwargs)
    procs.smg(address(10), port)
    procs.standin(address(11), port, "prefill", "--bootstrap-port", str(free_port(address(11))))
    procs.standin(address(12), port, "decode")
    return run, jobs


def _events(run: Run) -> list[str]:
    return list(Event.objects.filter(run_id=run.pk).order_by("id").values_list("message", flat=True))


@pytest.mark.step_case("sync_routers", "eligibility")
@pytest.mark.step_case("sync_routers", "success")
def test_sync_routers_lists_the_ready_workers_with_their_reported_roles_and_removes_a_drained_one(sent, procs):
    port = free_port(address(10))
    plain, _ = _service(port, [{"name": "web"}], name="plain")
    router_sync.sync_routers(plain.pk)
    assert not RouterSync.objects.filter(pk=plain.pk).exists(), "a service without a router has nothing to sync"

    run, jobs = _pd(procs, port)
    router_sync.sync_routers(run.pk)
    prefill, decode = f"http://{address(11)}:{port}", f"http://{address(12)}:{port}"
    wait_until(lambda: listed(address(10), port) == {(prefill, "prefill"), (decode, "decode")}, timeout=20,
               what="smg lists the prefill and the decode worker")
    row = RouterSync.objects.get(pk=run.pk)
    assert row.lease_token == "" and set(row.listed[str(jobs["router"].pk)]) == {
        str(jobs["prefill"].pk), str(jobs["decode"].pk)}
    added = [m for m in _events(run) if "added worker" in m]
    assert len(added) == 2 and any("as prefill (bootstrap port" in m for m in added), added
    assert ("process_run", run.pk) in sent.names(), "a drained replica may be waiting for this list"
    status, answer = post(f"http://{address(10)}:{port}/generate", {"text": "hello"})
    assert status == 200 and answer["meta_info"]["role"] == "decode", answer
    assert answer["meta_info"]["prefill"]["prefill"].startswith("prefill@"), "the decode got the prefill's KV"

    sent.clear()
    router_sync.sync_routers(run.pk)
    assert [m for m in _events(run) if "worker" in m] == added, "in sync: nothing added or removed again"

    Job.objects.filter(pk=jobs["decode"].pk).update(drain_at=timezone.now())
    router_sync.sync_routers(run.pk)
    assert any("removed worker" in m and decode in m for m in _events(run))
    assert ("sync_routers", run.pk) in sent.names(), "looked at again while the router drains it"
    wait_until(lambda: listed(address(10), port) == {(prefill, "prefill")}, timeout=20, what="decode removed")


@pytest.mark.step_case("sync_routers", "stale")
def test_sync_routers_with_a_stale_lease_drops_what_it_learned(sent, procs, monkeypatch):
    port = free_port(address(10))
    run, jobs = _pd(procs, port)
    around_body(monkeypatch, router_sync, "_sync", steal(RouterSync))
    router_sync.sync_routers(run.pk)
    row = RouterSync.objects.get(pk=run.pk)
    assert row.lease_token == "someone-else" and row.listed == {} and row.synced_at is None
    assert not [m for m in _events(run) if "added worker" in m], "its events go with its outcome"


@pytest.mark.step_case("sync_routers", "contention")
def test_sync_routers_does_nothing_while_another_worker_holds_the_run(sent, procs):
    port = free_port(address(10))
    run, jobs = _pd(procs, port)
    RouterSync.objects.create(run=run)
    token = claims.claim(RouterSync, run.pk)
    router_sync.sync_routers(run.pk)
    assert listed(address(10), port) == set() and RouterSync.objects.get(pk=run.pk).lease_token == token
    claims.forget_all()


def test_a_router_that_refuses_the_worker_api_and_a_worker_it_does_not_take_are_one_event_each(
        sent, procs, tmp_path):
    port = free_port(address(10))
    run, jobs = _service(port, PD)
    (tmp_path / "server_info").write_text('{"status": "ready", "disaggregation_mode": "decode"}')
    # not smg: a plain HTTP server where the router should be
    fake = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", address(10), "--directory",
                             str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs.procs.append(fake)
    wait_port(address(10), port)
    router_sync.sync_routers(run.pk)
    router_sync.sync_routers(run.pk)
    refused = [m for m in _events(run) if "refuses the worker API" in m]
    assert len(refused) == 1 and "GET /workers answered 404" in refused[0], _events(run)

    fake.kill()
    fake.wait(10)
    procs.smg(address(10), port, "--worker-startup-timeout-secs", "2")  # it gives up on a worker soon
    # the decode "worker" answers Muster's probe (/server_info) and nothing smg asks
    decoy = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", address(12), "--directory",
                              str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs.procs.append(decoy)
    procs.standin(address(11), port, "prefill", "--bootstrap-port", str(free_port(address(11))))
    wait_port(address(12), port)
    router_sync.sync_routers(run.pk)
    assert any("resolved:" in m and "refuses the worker API" in m for m in _events(run)), _events(run)
    for _ in range(3):
        RouterSync.objects.filter(pk=run.pk).update(attempts={k: [v[0], 0] for k, v in
                                                              RouterSync.objects.get(pk=run.pk).attempts.items()})
        time.sleep(2)  # smg's add job fails on the decoy's health check meanwhile
        router_sync.sync_routers(run.pk)
    not_taken = [m for m in _events(run) if "did not take worker" in m]
    assert len(not_taken) == 1 and f"{address(12)}:{port}" in not_taken[0], "\n".join(_events(run))
    assert listed(address(10), port) == {(f"http://{address(11)}:{port}", "prefill")}
