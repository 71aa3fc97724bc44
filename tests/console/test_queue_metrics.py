"""The queue in /metrics (console/queue_metrics.py), scraped over HTTP and parsed with
prometheus-client's parser: how long runs waited for a host before they were placed, the runs
waiting now, and the hosts and GPUs each project holds of each fleet (instances/rows.held)."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
import yaml

from tests.conftest import client_for
from tests.console.test_metrics import scrape, value
from tests.engine.helpers import Beat, wait_for_run
from tests.waiting import wait_until


@pytest.fixture
def token(settings):
    settings.MUSTER = {**settings.MUSTER, "METRICS_TOKEN": "scrape-token"}


def _submit(api, project: str, conf: str):
    from runs.models import Run

    answer = api.post(f"/api/projects/{project}/runs/", {"configuration": conf}, format="json")
    assert answer.status_code == 201, answer.content
    return Run.objects.get(project__name=project, name=yaml.safe_load(conf)["name"])


def _hosts(project, fleet, gpus: list[int]):
    from instances.models import Instance

    return [Instance.objects.create(project=project, fleet=fleet, name=f"{fleet.name}-{i}", status="busy",
                                    backend="ssh", resources={"gpus": [{"name": "A100", "memory_gb": 80}] * n})
            for i, n in enumerate(gpus)]


@pytest.mark.django_db
def test_each_project_s_hosts_and_gpus_held_per_fleet_count_a_host_once(client, token, settings, make_user):
    """What the workers would leave, written directly: jobs of two projects on hosts of their fleets
    named alike, each host held by its job's project (Instance.holder, which the engine's steps
    write: tests/engine/test_host_holders.py); the series count hosts per project and fleet, a
    host with two unfinished jobs (an old attempt still terminating beside the new one) once, a
    host whose job ended and was handed back not at all."""
    from instances.models import Fleet, Instance
    from instances.rows import usage_by_project
    from projects.models import Project
    from runs.models import Job

    runs = {}
    for project in ("main", "p2"):
        api = client_for(make_user(f"u-{project}", project))
        runs[project] = _submit(api, project, "type: task\nname: train\nnodes: 2\ncommands: [echo]\n")
    main, p2 = Project.objects.get(name="main"), Project.objects.get(name="p2")
    gpus_main = Fleet.objects.create(project=main, name="gpus", backend="ssh", configuration={})
    gpus_p2 = Fleet.objects.create(project=p2, name="gpus", backend="ssh", configuration={})
    Fleet.objects.create(project=main, name="spare", backend="ssh", configuration={})
    h0, h1, h2 = _hosts(main, gpus_main, [8, 8, 8])
    (p2_host,) = _hosts(p2, gpus_p2, [4])
    job0, job1 = runs["main"].current_jobs()
    Job.objects.filter(pk=job0.pk).update(status="running", instance=h0)
    Job.objects.filter(pk=job1.pk).update(status="running", instance=h1)
    Job.objects.create(run=runs["main"], submission_num=5, job_num=0, status="terminating", instance=h0,
                       superseded=True, node_group_name="0", spec={})
    Job.objects.create(run=runs["main"], submission_num=6, job_num=0, status="done", instance=h2,
                       superseded=True, node_group_name="0", spec={})
    p2_job = runs["p2"].current_jobs()[0]
    Job.objects.filter(pk=p2_job.pk).update(status="provisioning", instance=p2_host)
    Instance.objects.filter(pk__in=[h0.pk, h1.pk]).update(holder=main)
    Instance.objects.filter(pk=p2_host.pk).update(holder=p2)
    Instance.objects.filter(pk=h2.pk).update(status="idle")

    assert usage_by_project(gpus_main) == {main.pk: (2, 16)}
    assert usage_by_project(gpus_p2) == {p2.pk: (1, 4)}
    samples = scrape(client)
    assert value(samples, "muster_fleet_hosts_held", project="main", fleet="main/gpus") == 2
    assert value(samples, "muster_fleet_gpus_held", project="main", fleet="main/gpus") == 16
    assert value(samples, "muster_fleet_hosts_held", project="p2", fleet="p2/gpus") == 1
    assert value(samples, "muster_fleet_gpus_held", project="p2", fleet="p2/gpus") == 4
    # a fleet nobody uses has its sample at 0 (a series that drops rather than vanishes)
    assert samples[("muster_fleet_hosts_held", (("fleet", "main/spare"), ("project", "main")))] == 0

    # past the cap, a project and its fleets are `other`: the series stay bounded however many there are
    settings.MUSTER = {**settings.MUSTER, "METRICS_PROJECTS": 1}
    samples = scrape(client)
    held = {dict(labels)["fleet"]: n for (name, labels), n in samples.items() if name == "muster_fleet_hosts_held"}
    assert held == {"main/gpus": 2, "main/spare": 0, "other": 1}


@pytest.mark.django_db
def test_the_waits_are_a_histogram_per_project_and_the_waiting_runs_a_gauge(client, token, make_user):
    from runs.models import Job

    api = client_for(make_user("alice"))
    waits = {"quick": 3, "hour": 2 * 3600, "days": 3 * 24 * 3600}
    for name, seconds in waits.items():
        run = _submit(api, "main", f"type: task\nname: {name}\ncommands: [echo]\n")
        Job.objects.filter(run=run).update(host_wait=timedelta(seconds=seconds), status="done")
    _submit(api, "main", "type: task\nname: placed-at-once\ncommands: [echo]\n")  # no wait: not counted
    for name in ("waits-1", "waits-2"):
        run = _submit(api, "main", f"type: task\nname: {name}\nnodes: 2\ncommands: [echo]\n")
        Job.objects.filter(run=run, job_num=0).update(waiting_for="a free host: fleet gpus is full")
    samples = scrape(client)
    buckets = {dict(labels)["le"]: n for (name, labels), n in samples.items()
               if name == "muster_run_host_wait_seconds_bucket" and dict(labels)["project"] == "main"}
    assert (buckets["1.0"], buckets["5.0"], buckets["3600.0"], buckets["10800.0"]) == (0, 1, 1, 2)
    assert (buckets["86400.0"], buckets["172800.0"], buckets["604800.0"], buckets["+Inf"]) == (2, 2, 3, 3)
    assert value(samples, "muster_run_host_wait_seconds_count", project="main") == 3
    assert value(samples, "muster_run_host_wait_seconds_sum", project="main") == pytest.approx(sum(waits.values()))
    assert value(samples, "muster_runs_waiting_for_host", project="main") == 2


HOLDER = "type: task\nname: holder\ncommands: ['while [ ! -e {go} ]; do sleep 0.2; done']\n"
WAITER = "type: task\nname: waiter\ncommands: [echo placed]\nretry: {on_events: [no-capacity], duration: 10m}\n"


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_a_run_placed_after_a_wait_is_counted_with_its_wait_and_the_gauges_follow(
        client, token, superuser_api, fast_limits, celery_worker, tmp_path):
    """A real worker on a real one-host local fleet: a holder takes the host, a second run waits for
    it, the holder ends and the waiter is placed on the host it gave back. The scrape shows the wait
    while it lasts (one run waiting, the host held) and then the wait in the histogram, as long as
    the job waited; the holder, placed at once, is not in it."""
    from runs.models import Run

    resp = superuser_api.post("/api/projects/main/fleets/",
                              {"configuration": "type: fleet\nname: local1\nbackends: [local]\nnodes: 1\n"},
                              format="json")
    assert resp.status_code == 201, resp.content
    go = tmp_path / "go"
    try:
        with Beat():
            _submit(superuser_api, "main", HOLDER.format(go=go))
            wait_for_run("holder", statuses=("running",), timeout=90)
            before = time.monotonic()
            _submit(superuser_api, "main", WAITER)
            wait_until(lambda: superuser_api.get("/api/projects/main/runs/waiter/").json()["waiting_for"]
                       .startswith("a free host"), timeout=60, what="the waiter to wait for a host")
            samples = scrape(client)
            assert value(samples, "muster_runs_waiting_for_host", project="main") == 1
            assert value(samples, "muster_fleet_hosts_held", project="main", fleet="main/local1") == 1
            assert value(samples, "muster_run_host_wait_seconds_count", project="main") == 0
            time.sleep(1.5)  # a wait long enough to tell from nothing
            go.touch()
            waiter = wait_for_run("waiter", timeout=90)
            elapsed = time.monotonic() - before
        assert waiter.status == "done", waiter.termination_message
        job = waiter.current_jobs().get()
        assert job.host_wait is not None and job.host_wait >= timedelta(seconds=1.5)
        assert Run.objects.get(name="holder").current_jobs().get().host_wait is None, "placed at once: no wait"

        samples = scrape(client)
        assert value(samples, "muster_run_host_wait_seconds_count", project="main") == 1
        waited = value(samples, "muster_run_host_wait_seconds_sum", project="main")
        assert waited == pytest.approx(job.host_wait.total_seconds()) and 1.5 <= waited <= elapsed
        assert value(samples, "muster_run_host_wait_seconds_bucket", project="main", le="1.0") == 0
        assert value(samples, "muster_run_host_wait_seconds_bucket", project="main", le="+Inf") == 1
        assert value(samples, "muster_runs_waiting_for_host", project="main") == 0
        wait_until(lambda: value(scrape(client), "muster_fleet_hosts_held", project="main", fleet="main/local1") == 0,
                   timeout=30, what="the host given back")
    finally:
        go.touch()
        from engine.groups import terminate_fleet_instances
        from instances.models import Fleet

        for fleet in Fleet.objects.all():
            terminate_fleet_instances(fleet)
