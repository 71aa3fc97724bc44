"""The live services' replicas and their scaler's decisions as Prometheus families, labelled by
project and service: one series per live service (the endpoint processes count the requests)."""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


def service_families(label_of):
    from runs.choices import JOB_FINISHED, RUN_FINISHED
    from runs.models import Job, Run
    from serving.replicas import is_head, is_ready

    replicas = GaugeMetricFamily("muster_service_replicas", "A live service's replicas: ready (in the endpoint's "
                                 "pool) and desired (what it wants now)", labels=["project", "service", "state"])
    decisions = CounterMetricFamily("muster_service_scaling_decisions_total", "Changes of a service's wanted "
                                    "replicas its scaler made", labels=["project", "service"])
    runs = {run.pk: run for run in Run.objects.exclude(desired_replicas={}).exclude(status__in=RUN_FINISHED)
            .only("id", "name", "project_id", "desired_replicas", "scaling")}
    ready: dict[int, int] = dict.fromkeys(runs, 0)
    for job in Job.objects.filter(run_id__in=runs, superseded=False).exclude(status__in=JOB_FINISHED).only(
            "run_id", "status", "superseded", "ready_at", "node_group_rank"):
        ready[job.run_id] += is_ready(job) and is_head(job)
    for pk, run in sorted(runs.items(), key=lambda item: item[1].name):
        key = [label_of(run.project_id), run.name]
        replicas.add_metric([*key, "ready"], ready[pk])
        replicas.add_metric([*key, "desired"], sum((run.desired_replicas or {}).values()))
        decisions.add_metric(key, int((run.scaling or {}).get("decisions", 0)))
    return [replicas, decisions]
