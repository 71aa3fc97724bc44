"""The queue as Prometheus families: how long jobs waited for a host before they were placed, the
runs waiting now, the hosts and GPUs each project holds of each active fleet and, on a shared
fleet, its quota there.

Each is one aggregate query, whatever the number of jobs: the waits from the jobs that waited (a
partial index holds only them; the wait is written by the UPDATE that placed the job,
engine/submitted/waiting.placed, so any worker's placement is read here without a counter to
flush), the waiting runs from the unfinished jobs (the jobs' status index), the holdings from the
hosts' holders (Instance.holder, a partial index of the hosts in use), the
quotas from the shares (FleetShare, one row per project sharing a fleet).
"""

from __future__ import annotations

from datetime import timedelta

from django.db.models import Count, F, Q, Sum
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily

# seconds: a host that frees within a second up to a `retry.duration` of days on a busy cluster
BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 24 * 3600,
           2 * 24 * 3600, 7 * 24 * 3600)
OTHER = "other"  # console.metrics.OTHER: the label of every project past the cap


def host_wait_histogram(label_of) -> HistogramMetricFamily:
    from runs.models import Job

    family = HistogramMetricFamily("muster_run_host_wait_seconds", "Seconds a run's job waited for a host of a "
                                   "full fleet before it was placed, over the waits that ended in a placement",
                                   labels=["project"])
    # counts of host_wait, not of ids: the columns the partial index holds, so it is read alone
    per_bucket = {f"le_{i}": Count("host_wait", filter=Q(host_wait__lte=timedelta(seconds=b)))
                  for i, b in enumerate(BUCKETS)}
    rows = (Job.objects.filter(host_wait__isnull=False).values(project_id=F("run__project_id"))
            .annotate(n=Count("host_wait"), total=Sum("host_wait"), **per_bucket).order_by())
    merged: dict[str, list] = {}
    for row in rows:
        counts = [row[f"le_{i}"] for i in range(len(BUCKETS))] + [row["n"]]
        seconds = row["total"].total_seconds() if row["total"] is not None else 0.0
        before = merged.setdefault(label_of(row["project_id"]), [[0] * len(counts), 0.0])
        before[0] = [a + b for a, b in zip(before[0], counts, strict=True)]
        before[1] += seconds
    for label, (counts, seconds) in sorted(merged.items()):
        buckets = [(str(float(b)), counts[i]) for i, b in enumerate(BUCKETS)] + [("+Inf", counts[-1])]
        family.add_metric([label], buckets, seconds)
    return family


def fleet_label(label_of, owner_id: int, name: str) -> str:
    """`owner/name`: fleet names are a project's own, so two projects' `local` stay apart (and a fleet
    another project uses is told from its own); every fleet of a project past the cap is `other`."""
    owner = label_of(owner_id)
    return OTHER if owner == OTHER else f"{owner}/{name}"


def queue_families(label_of):
    from instances.models import Fleet, FleetShare, FleetStatus
    from instances.rows import held
    from runs.queue import waiting_per_project

    yield host_wait_histogram(label_of)
    waiting = GaugeMetricFamily("muster_runs_waiting_for_host", "Runs waiting for a host of a full fleet, by "
                                "project", labels=["project"])
    hosts = GaugeMetricFamily("muster_fleet_hosts_held", "Hosts of a fleet that a project's jobs hold", labels=["project", "fleet"])
    gpus = GaugeMetricFamily("muster_fleet_gpus_held", "GPUs of the hosts of a fleet that a project's "
                             "jobs hold", labels=["project", "fleet"])
    quota = GaugeMetricFamily("muster_fleet_quota_hosts", "Hosts of a shared fleet a project's quota gives it "
                              "(docs/queueing.md, shared fleets)", labels=["project", "fleet"])
    quota_gpus = GaugeMetricFamily("muster_fleet_quota_gpus", "GPUs of a shared fleet a project's quota gives it",
                                   labels=["project", "fleet"])
    # active fleets only: a failed or terminating fleet holds nothing worth a series
    fleets = {pk: (owner, name) for pk, owner, name in Fleet.objects.filter(status=FleetStatus.ACTIVE)
              .values_list("pk", "project_id", "name")}
    # every fleet has a sample for its project and each project it is shared with, 0 when it holds
    # nothing: a graph drops to 0 rather than ending
    used: dict[tuple[str, str], list[int]] = {}
    for owner, name in fleets.values():
        used.setdefault((label_of(owner), fleet_label(label_of, owner, name)), [0, 0])
    quotas: dict[tuple[str, str], list[int]] = {}
    for fleet_id, project_id, n_hosts, n_gpus in FleetShare.objects.filter(fleet_id__in=list(fleets)).values_list(
            "fleet_id", "project_id", "hosts", "gpus"):
        key = (label_of(project_id), fleet_label(label_of, *fleets[fleet_id]))
        used.setdefault(key, [0, 0])
        sums = quotas.setdefault(key, [None, None])
        for i, n in enumerate((n_hosts, n_gpus)):  # None: no quota on it (no sample), as the share says
            if n is not None:
                sums[i] = (sums[i] or 0) + n
    for (fleet_id, project_id), (n_hosts, n_gpus) in held().items():
        if fleet_id not in fleets:
            continue  # deleted since the read of the fleets
        sums = used.setdefault((label_of(project_id), fleet_label(label_of, *fleets[fleet_id])), [0, 0])
        sums[0] += n_hosts
        sums[1] += n_gpus
    for key, (n_hosts, n_gpus) in sorted(used.items()):
        hosts.add_metric(list(key), n_hosts)
        gpus.add_metric(list(key), n_gpus)
    for key, (n_hosts, n_gpus) in sorted(quotas.items()):
        if n_hosts is not None:
            quota.add_metric(list(key), n_hosts)
        if n_gpus is not None:
            quota_gpus.add_metric(list(key), n_gpus)
    counts = {label_of(owner): 0 for owner, _ in fleets.values()}
    for project_id, n in waiting_per_project().items():
        counts[label_of(project_id)] = counts.get(label_of(project_id), 0) + n
    for label, n in sorted(counts.items()):
        waiting.add_metric([label], n)
    yield waiting
    yield hosts
    yield gpus
    yield quota
    yield quota_gpus
