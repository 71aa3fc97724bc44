"""/metrics as Prometheus scrapes it: text format, parsed with prometheus-client's own parser."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import client_for
from tests.waiting import patient, wait_until


def scrape(client, token="scrape-token") -> dict[tuple, float]:
    resp = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert resp.status_code == 200, resp.content
    assert resp["Content-Type"].startswith("text/plain; version=0.0.4")
    samples = {}
    for family in text_string_to_metric_families(resp.content.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples, name, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.fixture
def token(settings):
    settings.MUSTER = {**settings.MUSTER, "METRICS_TOKEN": "scrape-token"}


@pytest.mark.django_db
def test_metrics_are_closed_without_a_token_or_the_open_setting(client, settings):
    assert client.get("/metrics").status_code == 403
    settings.MUSTER = {**settings.MUSTER, "METRICS_OPEN": True}
    assert client.get("/metrics").status_code == 200
    settings.MUSTER = {**settings.MUSTER, "METRICS_TOKEN": "scrape-token", "METRICS_OPEN": False}
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Token scrape-token").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-token").status_code == 200


@pytest.mark.django_db
def test_runs_and_instances_are_counted_by_status_and_backend(client, token, make_user):
    from instances.models import Fleet, Instance
    from projects.models import Project

    alice = make_user("alice")
    api = client_for(alice)
    for name in ("a", "b"):
        conf = f"type: task\nname: {name}\nnodes: 2\ncommands: [echo hi]\n"
        assert api.post("/api/projects/main/runs/", {"configuration": conf}, format="json").status_code == 201
    project = Project.objects.get(name="main")
    fleet = Fleet.objects.create(project=project, name="gpus", backend="ssh", configuration={})
    for i, status in enumerate(["idle", "idle", "busy"]):
        Instance.objects.create(project=project, fleet=fleet, name=f"h{i}", status=status, backend="ssh",
                                unreachable=(i == 2))
    samples = scrape(client)
    assert value(samples, "muster_runs", status="submitted", backend="none", project="main") == 2
    assert value(samples, "muster_jobs", status="submitted", backend="none", project="main") == 4
    assert value(samples, "muster_instances", status="idle", backend="ssh", project="main") == 2
    assert value(samples, "muster_instances", status="busy", backend="ssh", project="main") == 1
    assert value(samples, "muster_instances_unreachable", backend="ssh") == 1


@pytest.mark.django_db
def test_unreachable_instances_have_a_zero_sample_for_every_backend_when_none_is_unreachable(client, token):
    from instances.models import Fleet, Instance
    from projects.models import Project

    project = Project.objects.create(name="main")
    fleet = Fleet.objects.create(project=project, name="hosts", backend="ssh", configuration={})
    Instance.objects.create(project=project, fleet=fleet, name="h0", status="idle", backend="ssh")
    samples = scrape(client)
    # a series at 0, not a missing one: `muster_instances_unreachable > 0` must have something to compare
    for backend in ("gcp", "local", "ssh"):
        assert samples[("muster_instances_unreachable", (("backend", backend),))] == 0


@pytest.fixture
def local_fleet(superuser_api):
    """A one-host local fleet, its runner agent stopped however the test ends."""
    resp = superuser_api.post("/api/projects/main/fleets/",
                              {"configuration": "type: fleet\nname: local1\nbackends: [local]\nnodes: 1\n"},
                              format="json")
    assert resp.status_code == 201, resp.content
    yield
    from engine.groups import terminate_fleet_instances
    from instances.models import Fleet

    for fleet in Fleet.objects.all():
        terminate_fleet_instances(fleet)


def _terminal(name):
    from runs.models import Run

    run = Run.objects.get(name=name)
    return run if run.finished else None


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_queue_depth_task_outcomes_and_a_sweep_recovery_after_a_lost_message(client, token, superuser_api,
                                                                            fast_limits, local_fleet, celery_app,
                                                                            celery_worker_parameters):
    """A run is submitted while no worker runs; its message is lost (the queue purged). The scrape
    shows the message waiting, then the sweep (sent as beat sends it) finds the job and sends it
    again, the run finishes, and the workers' task counts and the recovery appear in /metrics."""
    from celery.contrib.testing.worker import start_worker

    from engine import tasks

    resp = superuser_api.post("/api/projects/main/runs/", {"configuration": "type: task\nname: m\n"
                                                           "commands: [echo metrics]\n"}, format="json")
    assert resp.status_code == 201, resp.content
    queue = celery_app.conf.task_default_queue
    assert value(scrape(client), "muster_broker_queue_depth", queue=queue) >= 1
    with celery_app.connection_for_write() as conn:
        conn.default_channel.queue_purge(queue)
    assert value(scrape(client), "muster_broker_queue_depth", queue=queue) == 0

    with start_worker(celery_app, **celery_worker_parameters):
        def ended():
            tasks.sweep.delay()
            tasks.watch_running.delay()
            return _terminal("m")

        # the run's end first, then the counts: a scrape read before the run ended shows it running
        run = wait_until(ended, 90, "the run ended", interval=0.5)
        assert run.status == "done", run.termination_message

        def counted():
            tasks.sweep.delay()  # a task, so the worker flushes its counts (at most every 5 s)
            samples = scrape(client)
            return (value(samples, "muster_sweep_recoveries_total", kind="provision") >= 1
                    and value(samples, "muster_tasks_total", task="engine.tasks.provision_job", outcome="success") >= 1
                    and samples)

        samples = wait_until(counted, 60, "the recovery and the tasks counted", interval=0.5)
    assert value(samples, "muster_task_seconds_total", task="engine.tasks.provision_job", outcome="success") > 0
    assert value(samples, "muster_runs", status="done", backend="local", project="main") == 1
    assert value(samples, "muster_jobs", status="done", backend="local", project="main") == 1
    assert value(samples, "muster_run_duration_seconds_count", project="main") == 1
    assert value(samples, "muster_run_queue_wait_seconds_count", project="main") == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_a_quiet_server_counts_no_recovery_for_runs_whose_jobs_started_as_they_should(
        client, token, superuser_api, fast_limits, local_fleet, celery_worker, tmp_path):
    """No message is lost: a run starts and runs while beat's sweep passes many times. The sweep
    derives the run once after its job went running (that move nudges nobody by design), which is
    its routine and not a recovery: muster_sweep_recoveries_total stays 0."""
    import time

    from engine import tasks
    from runs.models import Run

    # A row counts as lost three sweep intervals after its message was due; on a loaded machine a
    # message can wait in the queue longer than 3 x 0.5 s, which is late, not lost.
    fast_limits["SWEEP_INTERVAL"] = patient(0.5)
    go = tmp_path / "go"
    conf = f"type: task\nname: quiet\ncommands: ['while [ ! -e {go} ]; do sleep 0.2; done']\n"
    assert superuser_api.post("/api/projects/main/runs/", {"configuration": conf}, format="json").status_code == 201
    wait_until(lambda: Run.objects.get(name="quiet").status == "running", 60, "the run running")
    stale = 3 * fast_limits["SWEEP_INTERVAL"]
    deadline = time.monotonic() + 4 * stale
    while time.monotonic() < deadline:  # beat's sweeps, past the age at which a row counts as stale
        tasks.sweep.delay()
        time.sleep(fast_limits["SWEEP_INTERVAL"])

    def derive_counted():
        tasks.sweep.delay()  # a task, so the worker flushes its counts (at most every 5 s)
        samples = scrape(client)
        return (value(samples, "muster_sweep_routine_sends_total", kind="derive")
                + value(samples, "muster_sweep_recoveries_total", kind="runs") >= 1) and samples

    samples = wait_until(derive_counted, 30, "the sweep's derive of the run counted", interval=0.5)
    recoveries = {k: v for k, v in samples.items() if k[0] == "muster_sweep_recoveries_total" and v}
    assert recoveries == {}, f"a quiet server counted recoveries: {recoveries}"
    assert value(samples, "muster_sweep_routine_sends_total", kind="derive") >= 1
    go.touch()
    run = wait_until(lambda: _terminal("quiet"), 60, "the run ended")
    assert run.status == "done"


@pytest.mark.django_db
def test_the_project_label_names_the_first_projects_and_sums_the_rest_as_other(client, token, settings, make_user):
    settings.MUSTER = {**settings.MUSTER, "METRICS_PROJECTS": 2}
    for project in ("p1", "p2", "p3", "p4"):
        user = make_user(f"u-{project}", project)
        conf = "type: task\nname: r\nnodes: 2\ncommands: [echo]\n"
        assert client_for(user).post(f"/api/projects/{project}/runs/", {"configuration": conf},
                                     format="json").status_code == 201
    samples = scrape(client)
    runs = {dict(labels)["project"]: n for (name, labels), n in samples.items() if name == "muster_runs"}
    assert runs == {"p1": 1, "p2": 1, "other": 2}
    jobs = {dict(labels)["project"]: n for (name, labels), n in samples.items() if name == "muster_jobs"}
    assert jobs == {"p1": 2, "p2": 2, "other": 4}


@pytest.mark.django_db
def test_run_duration_and_queue_wait_are_histograms_from_submit(client, token, make_user):
    from datetime import timedelta

    from runs.models import Run

    alice = make_user("alice")
    waits_and_durations = {"fast": (2, 40), "slow": (400, 4000), "never-ran": (None, 10), "queued": (None, None)}
    for name in waits_and_durations:
        conf = f"type: task\nname: {name}\ncommands: [echo]\n"
        assert client_for(alice).post("/api/projects/main/runs/", {"configuration": conf},
                                      format="json").status_code == 201
    for name, (wait, took) in waits_and_durations.items():
        run = Run.objects.get(name=name)
        Run.objects.filter(pk=run.pk).update(
            started_at=run.submitted_at + timedelta(seconds=wait) if wait is not None else None,
            finished_at=run.submitted_at + timedelta(seconds=took) if took is not None else None)
    samples = scrape(client)

    def histogram(name):
        return {dict(labels)["le"]: n for (sample, labels), n in samples.items()
                if sample == f"{name}_bucket" and dict(labels)["project"] == "main"}

    wait = histogram("muster_run_queue_wait_seconds")
    assert wait["1.0"] == 0 and wait["5.0"] == 1 and wait["300.0"] == 1 and wait["600.0"] == 2 and wait["+Inf"] == 2
    assert value(samples, "muster_run_queue_wait_seconds_sum", project="main") == pytest.approx(402)
    took = histogram("muster_run_duration_seconds")
    assert took["5.0"] == 0 and took["15.0"] == 1 and took["60.0"] == 2 and took["3600.0"] == 2
    assert took["10800.0"] == 3 and took["+Inf"] == 3
    assert value(samples, "muster_run_duration_seconds_count", project="main") == 3
    assert value(samples, "muster_run_duration_seconds_sum", project="main") == pytest.approx(4050)


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_a_claim_refused_because_a_killed_worker_still_holds_the_row_is_counted(client, token, api, fast_limits,
                                                                              celery_worker):
    from datetime import timedelta

    from django.utils import timezone

    from engine import tasks
    from runs.models import Run

    conf = "type: task\nname: held\ncommands: [echo hi]\n"
    assert api.post("/api/projects/main/runs/", {"configuration": conf}, format="json").status_code == 201
    run = Run.objects.get(name="held")
    # what a worker killed with -9 in the middle of process_run leaves: its lease, until it runs out
    Run.objects.filter(pk=run.pk).update(lease_until=timezone.now() + timedelta(minutes=5), lease_token="x" * 32)

    def counted():
        tasks.process_run.delay(run.pk)
        return value(scrape(client), "muster_claim_conflicts_total", table="run") >= 1

    wait_until(counted, 60, "the refused claim counted", interval=0.5)
