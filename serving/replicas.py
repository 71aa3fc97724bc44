"""A service's replicas as a user sees them: how many are ready (in the endpoint's pool) of how
many it wants. Read from the run's current jobs, already loaded with the run (no query of its own)."""

from __future__ import annotations

from runs.choices import JobStatus
from serving.urls_for import service_url


def is_ready(job) -> bool:
    """In the endpoint's pool: running, not replaced, and its probes passed (`ready_at`; a group
    without probes is ready once it runs)."""
    return job.status == JobStatus.RUNNING and not job.superseded and job.ready_at is not None


def is_head(job) -> bool:
    """Node 0 of its replica: a replica of `nodes: N` is N jobs, and only its node 0 is routed to
    and registered with a router."""
    return job.node_group_rank == 0


def replica_counts(run, jobs) -> dict[str, int]:
    """{ready, total} in replicas (a multi-host replica counts once, by its node 0): total is what
    the run wants now (`desired_replicas`, summed over its groups), so a rolling update's extra
    replica does not show as a larger service."""
    return {"ready": sum(1 for job in jobs if is_ready(job) and is_head(job)),
            "total": sum((run.desired_replicas or {}).values())}


def service_view(run, jobs) -> dict | None:
    """What the console shows of a service: its URL, replicas ready of wanted, its deployment."""
    if run.configuration.get("type") != "service":
        return None
    return {"url": service_url(run), **replica_counts(run, jobs), "deployment": run.deployment_num}
