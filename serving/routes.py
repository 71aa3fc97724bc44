"""The routing table the endpoint reads: a service, its keys, and its ready replicas' addresses.

A replica is in the table when its node 0 (serving.replicas.is_head: a multi-host replica's
other nodes are never routed to) is ready (serving.replicas.is_ready: its job runs, is its
replica's current submission, has `ready_at`: probes passed, or it runs and has none) and the run
is neither finished nor asked to stop (a stop drains: out of the pool first); for a service with a
`router` group, it is of the run's `serving_deployment` too. The engine sends
`serving.rows.notify_routes(run_id)` in the transaction that changes any of those; the endpoint
re-reads on that and on a timer.

A service with a `router` group (PD: a router in front of prefill and decode workers) has only
that group's ready heads in the table: the workers are the router's to reach (serving/router_sync.py
keeps its worker list); and a replica of `nodes: N` is in it by its node 0 only. A router whose list
Muster keeps (`router: {type: smg}`) is in it only once the router sync saw it serve since it last
became ready (serving/router_sync.py `serves`, RouterSync.routable): smg answers 503 until it has its
workers; the sync's outcome notifies the endpoints when a router becomes routable.

The address is the one Muster reaches the job's instance on (its `hostname`: the SSH host's
address, a local instance's loopback address) and the service's `port`.

Read by the endpoint in a thread of its own (serving/proxy/table.py), never per request.
"""

from __future__ import annotations

from dataclasses import dataclass

from instances.models import FleetBackend, Instance
from runs.choices import JOB_FINISHED, RUN_FINISHED
from runs.configuration.stored import StoredService, run_configuration
from runs.models import Job, Run
from serving.replicas import is_head, is_ready
from serving.router_sync import ready_mark, routable, routed_group, router_group


@dataclass(frozen=True)
class Replica:
    job_id: int
    host: str
    port: int
    instance_id: int | None = None
    # the SSH path (serving/proxy/tunnels.py) for an SSH host the server cannot reach directly:
    # whether the host has one, and its own address for the replica (DSTACK_NODE_IP)
    ssh: bool = False
    inner: str = ""

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


@dataclass(frozen=True)
class Service:
    run_id: int
    project: str
    name: str
    auth: bool
    strip_prefix: bool
    port: int
    # every group may go down to no replica (`replicas: 0..N`): a request then waits for one
    scales_to_zero: bool
    replicas: tuple[Replica, ...]
    total_replicas: int


def _service(run: Run) -> Service | None:
    conf = run_configuration(run)
    if not isinstance(conf, StoredService):
        return None
    live = list(Job.objects.filter(run=run, superseded=False).select_related("instance")
                .only("id", "status", "superseded", "ready_at", "deployment_num", "node_group_name",
                      "node_group_rank", "instance__id", "instance__hostname", "instance__internal_ip",
                      "instance__backend"))
    routed = routed_group(conf)  # a PD service: the endpoint sends to its routers only, they to the workers
    # and to its serving deployment's only: an update's new routers join in the one write that switches
    # (engine/replicas/revisions.py)
    serving = [j for j in live if routed is None or j.deployment_num == run.serving_deployment]
    if router_group(conf) is not None:  # an smg router: only once a sync saw it serve (it 503s before)
        marks = routable(run.id)
        serving = [j for j in serving if j.node_group_name != routed or marks.get(str(j.id)) == ready_mark(j)]
    ready = () if run.stop_requested else tuple(
        Replica(job.id, job.instance.hostname, conf.port, job.instance.id,
                ssh=job.instance.backend == FleetBackend.SSH, inner=job.instance.internal_ip) for job in serving
        if is_ready(job) and is_head(job) and job.instance is not None and job.instance.hostname
        and (routed is None or job.node_group_name == routed))
    groups = [g for g in conf.groups if g.replicas is not None]
    return Service(run_id=run.id, project=run.project.name, name=run.name, auth=conf.auth,
                   strip_prefix=conf.strip_prefix, port=conf.port,
                   scales_to_zero=bool(groups) and all(g.replicas.min == 0 for g in groups),
                   replicas=tuple(sorted(ready, key=lambda r: r.job_id)),
                   total_replicas=len([j for j in live if j.status not in JOB_FINISHED and is_head(j)]))


def service(project: str, name: str) -> Service | None:
    """The service `name` of project `project` that has not finished (the newest such run), or None."""
    run = (Run.objects.filter(project__name=project, name=name).exclude(status__in=RUN_FINISHED)
           .select_related("project").order_by("-id").first())
    return _service(run) if run is not None else None


def service_by_run(run_id: int) -> Service | None:
    """The service of run `run_id` as `service` reads it; None once it finished (or is no service)."""
    run = Run.objects.filter(pk=run_id).exclude(status__in=RUN_FINISHED).select_related("project").first()
    return _service(run) if run is not None else None


def ssh_target(instance_id: int):
    """How the engine logs in to the instance's host (its SSHTarget), or None when it has no SSH."""
    instance = Instance.objects.filter(pk=instance_id, backend=FleetBackend.SSH).select_related("fleet").first()
    return instance.ssh_target() if instance is not None else None
