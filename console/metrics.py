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

from console.queue_metrics import queue_families
from console.service_metrics import service_families
from console.usage_metrics import usage_families

# the classic text format, which every Prometheus version reads (generate_latest writes it; newer
# clients label it 1.0.0, a version older servers refuse)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


OTHER = "other"


def project_labels():
    """A function from project id to its `project` label. The first METRICS_PROJECTS projects made
    get their names (a new project never takes an old one's label); the rest share `other`, so the
    number of series stays bounded however many projects there are."""
    from projects.models import Project

    limit = max(0, int(settings.MUSTER["METRICS_PROJECTS"]))
    named = dict(Project.objects.order_by("id").values_list("id", "name")[:limit]) if limit else {}
    return lambda project_id: named.get(project_id, OTHER)


def _add_summed(family, rows, label_of, keys) -> None:
    """Rows grouped by project id, summed again by label (every project past the cap is `other`)."""
    sums: dict[tuple, int] = {}
    for row in rows:
        key = (*(row[k] or "none" for k in keys), label_of(row["project_id"]))
        sums[key] = sums.get(key, 0) + row["n"]
    for key, n in sorted(sums.items()):
        family.add_metric(list(key), n)


class _DatabaseCollector:
    def collect(self):
        from console.models import Counter
        from console.run_times import histograms
        from engine.messages import queued_messages
        from instances.models import FleetBackend, Instance, InstanceStatus
        from runs.models import Job, Run

        label_of = project_labels()
        runs = GaugeMetricFamily("muster_runs", "Runs by status, by the backend of their fleet and by project",
                                 labels=["status", "backend", "project"])
        _add_summed(runs, Run.objects.values("status", "project_id", backend=F("fleet__backend")).annotate(
            n=Count("id")), label_of, ("status", "backend"))
        yield runs
        jobs = GaugeMetricFamily("muster_jobs", "Jobs of the runs' current submissions by status, backend and "
                                 "project", labels=["status", "backend", "project"])
        current = Job.objects.filter(superseded=False)
        _add_summed(jobs, current.values("status", backend=F("instance__backend"), project_id=F("run__project_id"))
                    .annotate(n=Count("id")), label_of, ("status", "backend"))
        yield jobs
        yield from histograms(label_of)
        instances = GaugeMetricFamily("muster_instances", "Instances by status, backend and project",
                                      labels=["status", "backend", "project"])
        unreachable = GaugeMetricFamily("muster_instances_unreachable",
                                        "Live instances the engine cannot reach, by backend", labels=["backend"])
        _add_summed(instances, Instance.objects.values("status", "backend", "project_id").annotate(n=Count("id")),
                    label_of, ("status", "backend"))
        # every backend has a sample, 0 when none is unreachable: an alert on `> 0` needs a series to compare
        counts = dict.fromkeys(FleetBackend.values, 0)
        for row in (Instance.objects.filter(unreachable=True).exclude(status=InstanceStatus.TERMINATED)
                    .values("backend").annotate(n=Count("id"))):
            counts[row["backend"]] = row["n"]
        for backend, n in sorted(counts.items()):
            unreachable.add_metric([backend], n)
        yield instances
        yield unreachable
        yield from usage_families(label_of)
        yield from queue_families(label_of)
        yield from service_families(label_of)

        tasks = CounterMetricFamily("muster_tasks", "Celery tasks run, by task and outcome",
                                    labels=["task", "outcome"])
        seconds = CounterMetricFamily("muster_task_seconds", "Seconds spent in Celery tasks, by task and outcome",
                                      labels=["task", "outcome"])
        recoveries = CounterMetricFamily("muster_sweep_recoveries",
                                         "Rows the sweep found waiting too long and sent again, by kind",
                                         labels=["kind"])
        routine = CounterMetricFamily("muster_sweep_routine_sends",
                                      "Messages the sweep sends as its routine, not for a lost one, by kind",
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
            elif c.name == "sweep_routine":
                routine.add_metric([c.label], c.count)
            elif c.name == "claim_conflict":
                conflicts.add_metric([c.label], c.count)
        yield tasks
        yield seconds
        yield recoveries
        yield routine
        yield conflicts

        depth = queued_messages()
        if depth is not None:
            queue = GaugeMetricFamily("muster_broker_queue_depth", "Messages waiting in the task queue",
                                      labels=["queue"])
            from muster.celery import app

            queue.add_metric([app.conf.task_default_queue], depth)
            yield queue


def allowed(request) -> bool:
    token = settings.MUSTER["METRICS_TOKEN"] or ""
    if token:
        sent = request.headers.get("Authorization", "")
        return sent.startswith("Bearer ") and hmac.compare_digest(sent[len("Bearer "):].encode(), token.encode())
    return bool(settings.MUSTER["METRICS_OPEN"])


@require_GET
def metrics_view(request):
    if not allowed(request):
        why = ("send Authorization: Bearer <MUSTER_METRICS_TOKEN>" if settings.MUSTER["METRICS_TOKEN"]
               else "set MUSTER_METRICS_TOKEN (and send it as a bearer token) or MUSTER_METRICS_OPEN=1")
        return HttpResponse(f"metrics: {why}\n", status=401 if settings.MUSTER["METRICS_TOKEN"] else 403,
                            content_type="text/plain")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_DatabaseCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE)
