"""/metrics as Prometheus scrapes it: text format, parsed with prometheus-client's own parser."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import client_for
from tests.waiting import wait_until


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
    assert value(samples, "muster_runs", status="submitted", backend="none") == 2
    assert value(samples, "muster_jobs", status="submitted", backend="none") == 4
    assert value(samples, "muster_instances", status="idle", backend="ssh") == 2
    assert value(samples, "muster_instances", status="busy", backend="ssh") == 1
    assert value(samples, "muster_instances_unreachable", backend="ssh") == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_queue_depth_task_outcomes_and_a_sweep_recovery_after_a_lost_message(client, token, superuser_api,
                                                                            fast_limits, celery_app,
                                                                            celery_worker_parameters):
    """A run is submitted while no worker runs; its message is lost (the queue purged). The scrape
    shows the message waiting, then the sweep (sent as beat sends it) finds the job and sends it
    again, the run finishes, and the workers' task counts and the recovery appear in /metrics."""
    from celery.contrib.testing.worker import start_worker

    from engine import tasks
    from runs.models import Run

    resp = superuser_api.post("/api/projects/main/fleets/",
                              {"configuration": "type: fleet\nname: local1\nbackends: [local]\nnodes: 1\n"},
                              format="json")
    assert resp.status_code == 201, resp.content
    resp = superuser_api.post("/api/projects/main/runs/", {"configuration": "type: task\nname: m\n"
                                                           "commands: [echo metrics]\n"}, format="json")
    assert resp.status_code == 201, resp.content
    queue = celery_app.conf.task_default_queue
    assert value(scrape(client), "muster_broker_queue_depth", queue=queue) >= 1
    with celery_app.connection_for_write() as conn:
        conn.default_channel.queue_purge(queue)
    assert value(scrape(client), "muster_broker_queue_depth", queue=queue) == 0

    with start_worker(celery_app, **celery_worker_parameters):
        def recovered():
            tasks.sweep.delay()
            tasks.watch_running.delay()
            samples = scrape(client)
            return (Run.objects.get(name="m").status == "done"
                    and value(samples, "muster_sweep_recoveries_total", kind="provision") >= 1
                    and value(samples, "muster_tasks_total", task="engine.tasks.provision_job", outcome="success") >= 1
                    and samples)

        samples = wait_until(recovered, 90, "the run done and the recovery counted", interval=0.5)
    assert value(samples, "muster_task_seconds_total", task="engine.tasks.provision_job", outcome="success") > 0
    assert value(samples, "muster_runs", status="done", backend="local") == 1
    assert value(samples, "muster_jobs", status="done", backend="local") == 1
    from engine.groups import terminate_fleet_instances
    from instances.models import Fleet

    for fleet in Fleet.objects.all():
        terminate_fleet_instances(fleet)


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
