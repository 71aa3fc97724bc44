"""/metrics in the Prometheus text format, computed when it is scraped.

Gauges are counted from the database (what is, by status and backend); counters are the sums the
workers wrote (console/taskstats.py); the queue depth is asked of the broker.
"""

from __future__ import annotations

import hmac

from django.conf import settings
from django.db.models import Count, F
from django.http import HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

# the classic text format, which every Prometheus version reads (generate_latest writes it; newer
# clients label it 1.0.0, a version older servers refuse)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _DatabaseCollector:
    def collect(self):
        from console.models import Counter
        from engine.sweeps import queued_messages
        from instances.models import Instance, InstanceStatus
        from runs.models import Job, Run

        runs = GaugeMetricFamily("muster_runs", "Runs by status and by the backend of their fleet",
                                 labels=["status", "backend"])
        for row in Run.objects.values("status", backend=F("fleet__backend")).annotate(n=Count("id")):
            runs.add_metric([row["status"], row["backend"] or "none"], row["n"])
        yield runs
        jobs = GaugeMetricFamily("muster_jobs", "Jobs of the runs' current submissions by status and backend",
                                 labels=["status", "backend"])
        current = Job.objects.filter(submission_num=F("run__submission_num"))
        for row in current.values("status", backend=F("instance__backend")).annotate(n=Count("id")):
            jobs.add_metric([row["status"], row["backend"] or "none"], row["n"])
        yield jobs
        instances = GaugeMetricFamily("muster_instances", "Instances by status and backend",
                                      labels=["status", "backend"])
        unreachable = GaugeMetricFamily("muster_instances_unreachable",
                                        "Live instances the engine cannot reach, by backend", labels=["backend"])
        for row in Instance.objects.values("status", "backend").annotate(n=Count("id")):
            instances.add_metric([row["status"], row["backend"]], row["n"])
        for row in (Instance.objects.filter(unreachable=True).exclude(status=InstanceStatus.TERMINATED)
                    .values("backend").annotate(n=Count("id"))):
            unreachable.add_metric([row["backend"]], row["n"])
        yield instances
        yield unreachable

        tasks = CounterMetricFamily("muster_tasks", "Celery tasks run, by task and outcome",
                                    labels=["task", "outcome"])
        seconds = CounterMetricFamily("muster_task_seconds", "Seconds spent in Celery tasks, by task and outcome",
                                      labels=["task", "outcome"])
        recoveries = CounterMetricFamily("muster_sweep_recoveries",
                                         "Rows the sweep found waiting too long and sent again, by kind",
                                         labels=["kind"])
        conflicts = CounterMetricFamily("muster_claim_conflicts",
                                        "Claims refused because another worker held the row, by table",
                                        labels=["table"])
        for c in Counter.objects.all():
            if c.name == "task":
                tasks.add_metric([c.label, c.outcome], c.count)
                seconds.add_metric([c.label, c.outcome], c.seconds)
            elif c.name == "sweep_recovery":
                recoveries.add_metric([c.label], c.count)
            elif c.name == "claim_conflict":
                conflicts.add_metric([c.label], c.count)
        yield tasks
        yield seconds
        yield recoveries
        yield conflicts

        depth = queued_messages()
        if depth is not None:
            queue = GaugeMetricFamily("muster_broker_queue_depth", "Messages waiting in the task queue",
                                      labels=["queue"])
            from muster.celery import app

            queue.add_metric([app.conf.task_default_queue], depth)
            yield queue


def allowed(request) -> bool:
    token = settings.MUSTER.get("METRICS_TOKEN") or ""
    if token:
        sent = request.headers.get("Authorization", "")
        return sent.startswith("Bearer ") and hmac.compare_digest(sent[len("Bearer "):].encode(), token.encode())
    return bool(settings.MUSTER.get("METRICS_OPEN"))


@require_GET
def metrics_view(request):
    if not allowed(request):
        why = ("send Authorization: Bearer <MUSTER_METRICS_TOKEN>" if settings.MUSTER.get("METRICS_TOKEN")
               else "set MUSTER_METRICS_TOKEN (and send it as a bearer token) or MUSTER_METRICS_OPEN=1")
        return HttpResponse(f"metrics: {why}\n", status=401 if settings.MUSTER.get("METRICS_TOKEN") else 403,
                            content_type="text/plain")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_DatabaseCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE)
