"""Blue/green per deployment for a service with a `router` group: what keep.py does for it instead
of the per-group rolling update, so that no router ever lists workers of two deployments.

An update raises `deployment_num` above `serving_deployment` (runs/services/service_runs.py) and
records what a rollback restores (`Run.rollout`). Each pass while the rollout is under way:

1. every group of the new deployment is kept at its desired count beside the serving deployment,
   which is left as it is (its routers keep the endpoint's traffic);
2. a replica of the new deployment that fails (it did not start, its probes did not pass within
   the group's `ready_timeout`, its commands failed), or the new deployment not ready within the
   longest `ready_timeout` of its groups since the update (`deadline`: a replica waiting for a host,
   hosts being short for two deployments, has no timeout of its own), rolls the rollout back: the
   stored configuration, submitted text and desired_replicas are the serving deployment's again and
   `deployment_num` is the serving one; the new deployment's replicas are removed (step 4);
3. once every group of the new deployment has its desired count of ready heads, and its routers
   list them as ready (asked directly: the router sync, serving/router_sync.py, adds them, and smg
   takes them in the background), the endpoint switches to it (`switch`): one guarded write of `serving_deployment`, its event, notify_routes;
4. any live replica of a deployment other than the one kept (the serving one outside a rollout,
   the serving and the new one during it) is taken out of the pool, drained and stopped (keep.py's
   drain path): after a switch the old deployment, after a rollback the new one, after a second
   update the superseded one.

Both writes are guarded by the deployments they were worked out from, so an update written meanwhile
(it takes no lease) is never undone: the pass is simply worked out again from the new row.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from engine.replicas import nodes as replica_nodes
from engine.replicas import rows
from engine.tuning import ROUTER_CALL_TIMEOUT, ROUTER_LIST_CAP
from events.services import record
from runs.choices import FAILING_REASONS
from runs.configuration.stored import StoredService, run_configuration, stored_run
from runs.models import Job, Run
from serving.replica_http import ReplicaHTTPError, request
from serving.replicas import is_head, is_ready
from serving.router_sync import ready_mark, routable, router_group, routers, worker_url, workers_for
from serving.rows import notify_routes


def rolling_out(run: Run) -> bool:
    return run.serving_deployment < run.deployment_num


def failed_new(run: Run, jobs: list[Job]) -> Job | None:
    """A replica of the deployment being rolled out that failed (not one removed on purpose)."""
    if not rolling_out(run):
        return None
    return next((j for j in jobs if j.finished and j.deployment_num == run.deployment_num and j.drain_at is None
                 and j.termination_reason in FAILING_REASONS), None)


def failure(job: Job) -> str:
    return (f"replica {job.node_group_name}/{job.replica_num} of deployment {job.deployment_num} "
            f"{job.termination_reason}: {job.termination_message or 'no message'}")


def deadline(run: Run, conf: StoredService) -> datetime | None:
    """When a rollout not switched yet is given up: the update's time plus the longest `ready_timeout`
    of the new deployment's groups (a replica waiting for a host has no timeout of its own); None
    when a group has none (0) or the record has no time."""
    started = (run.rollout or {}).get("started_at")
    limits = [g.ready_timeout for g in conf.groups]
    if not started or not limits or not all(limits):
        return None
    return datetime.fromisoformat(started) + timedelta(seconds=max(limits))


def overdue(run: Run, live: list[Job]) -> str:
    """Why a rollout past its deadline is rolled back (it names the replicas still waiting for a host:
    blue/green runs both deployments at once)."""
    waiting = [j for j in live if j.deployment_num == run.deployment_num and j.waiting_for]
    why = f"deployment {run.deployment_num} not ready within the longest ready_timeout of its groups since the update"
    if waiting:
        why += (f"; {len(waiting)} of its replicas waited for a host ({waiting[0].waiting_for}): blue/green needs "
                "hosts for every group of both deployments at once")
    conf = run_configuration(run)
    empty = [g.name for g in conf.groups if int((run.desired_replicas or {}).get(g.name, 0)) and not any(
        j.deployment_num == run.deployment_num and j.node_group_name == g.name for j in live)]
    if empty and isinstance(conf, StoredService) and max_surge(conf) is not None:
        why += (f"; max_surge {max_surge(conf)} left no host for group(s) {', '.join(empty)} (the serving "
                "deployment keeps its router and one replica of each group): raise max_surge")
    return why


def roll_back(run: Run, why: str) -> bool:
    """Step 2: the run back at its serving deployment, in one write guarded by the deployments the
    pass read; `run` (the pass's copy) follows. False: an update came in between (nothing written)."""
    serving, failed = run.serving_deployment, run.deployment_num
    restore = run.rollout or {}
    why = why[:900]
    fields = {"deployment_num": serving, "rollout": {}, "updated_at": timezone.now()}
    if restore:
        fields.update(configuration=restore.get("configuration") or run.configuration,
                      submitted_text=restore.get("submitted_text", run.submitted_text),
                      desired_replicas=restore.get("desired_replicas") or {})
    with transaction.atomic():
        if not Run.objects.filter(pk=run.pk, deployment_num=failed, serving_deployment=serving).update(**fields):
            return False
        record(run.project_id, f"run {run.name}",
               f"rollout to deployment {failed} failed ({why}): rolled back to deployment {serving}, which kept "
               f"serving; its configuration and replicas are restored and deployment {failed}'s replicas removed",
               status=run.status, run_id=run.pk)
    for name, value in fields.items():
        setattr(run, name, value)
    return True


def switch_due(run: Run, conf: StoredService, live: list[Job], stuck: bool) -> bool | None:
    """Step 3's condition: True to switch now; False not ready; None ready but the new routers do
    not list every worker yet (look again soon). `stuck`: under max_surge, the new deployment can
    grow no further (`may_switch_short`)."""
    if not (ready_to_switch(run, conf, live) or (stuck and may_switch_short(run, conf, live))):
        return False
    return True if synced(run, conf, live) else None


def ready_to_switch(run: Run, conf: StoredService, live: list[Job]) -> bool:
    """Every group of the new deployment has its desired count of ready heads, none of them draining."""
    desired = run.desired_replicas or {}
    for group in conf.groups:
        heads = [j for j in live if j.node_group_name == group.name and j.deployment_num == run.deployment_num
                 and j.drain_at is None and is_head(j) and is_ready(j)]
        if len(heads) < int(desired.get(group.name, 0)):
            return False
    return True


def synced(run: Run, conf: StoredService, live: list[Job]) -> bool:
    """Each ready router of the new deployment lists every ready worker of its deployment, healthy
    and ready, as the router itself answers (GET /workers): smg takes a worker in the background
    after accepting it, and sends a request to none of a role until one is ready. A router whose
    list Muster does not keep (not smg) is taken as it is. And the router sync has seen each serve
    (RouterSync.routable): the endpoint routes to no router before (serving/routes.py)."""
    group = router_group(conf)
    if group is None:
        return True
    new = [j for j in live if j.deployment_num == run.deployment_num]
    marks = routable(run.pk)
    for router in routers(group, new):
        if marks.get(str(router.pk)) != ready_mark(router):
            return False
        try:
            answer = request(router, conf.port, "GET", "/workers", timeout=ROUTER_CALL_TIMEOUT,
                             max_bytes=ROUTER_LIST_CAP)
            entries = answer.json()["workers"] if answer.status == 200 else []
        except (ReplicaHTTPError, ValueError, KeyError, TypeError):
            return False  # the sync says why (its events); the switch waits
        taken = {e.get("url") for e in entries if isinstance(e, dict) and e.get("is_healthy", True)
                 and e.get("status", "ready") == "ready"}
        if any(worker_url(j, conf.port) not in taken for j in workers_for(group, new, router)):
            return False
    return True


def switch(run: Run) -> bool:
    """Step 3: the endpoint sends to the new deployment's routers from the commit on (one write, its
    event and the endpoints' re-read in one transaction). False: an update came in between."""
    old, new = run.serving_deployment, run.deployment_num
    with transaction.atomic():
        if not Run.objects.filter(pk=run.pk, deployment_num=new, serving_deployment=old).update(
                serving_deployment=new, rollout={}):
            return False
        record(run.project_id, f"run {run.name}",
               f"switched to deployment {new}: its routers and workers are ready, the endpoint sends to its routers "
               f"now; deployment {old} drains and stops", status=run.status, run_id=run.pk)
        notify_routes(run.pk)
    run.serving_deployment, run.rollout = new, {}
    return True


def drain_others(run: Run, live: list[Job], routed: bool) -> None:
    """Step 4. `routed` False (a rollback restored a configuration without a router): only the
    rolled-back deployment's replicas go; older ones are rolled out replica by replica as ever."""
    keep = {run.serving_deployment, run.deployment_num}
    for job in live:
        if job.drain_at is None and job.deployment_num not in keep and (routed or job.deployment_num > run.deployment_num):
            if job.deployment_num < run.serving_deployment:
                why = f"deployment {run.serving_deployment} serves now, deployment {job.deployment_num} is removed"
            elif job.deployment_num > run.deployment_num:
                why = f"deployment {job.deployment_num} was rolled back"
            else:
                why = f"deployment {job.deployment_num} was superseded by deployment {run.deployment_num}"
            rows.drain(job, why)


def max_surge(conf: StoredService) -> int | None:
    return conf.rollout.max_surge if conf.rollout is not None else None


def grow_within_surge(run: Run, conf: StoredService, live: list[Job], jobs: list[Job], limit: int,
                      others: dict) -> bool:
    """Step 1 under `rollout: {max_surge: N}`: the run holds at most the hosts of the serving
    deployment's wanted replicas plus N (a live job, a draining one too, holds one; a replica of
    `nodes: K` takes K). The new deployment grows its router first, then its other groups in turn,
    while that allows; once it does not, the serving deployment's workers shrink one replica at a
    time (out of the pool and out of its routers, drained and stopped), never a group below one
    replica and never its router. Returns whether the new deployment can grow no further before the
    switch (the switch then comes once each of its groups has a ready replica). `others`: each
    multi-host replica's other nodes, drained with it."""
    desired = {name: int(n) for name, n in (run.desired_replicas or {}).items()}
    budget = _serving_hosts(run) + limit
    new = [j for j in live if j.deployment_num == run.deployment_num and j.drain_at is None and is_head(j)]
    count = {g.name: sum(1 for j in new if j.node_group_name == g.name) for g in conf.groups}
    in_use = len(live)
    used = {(j.node_group_name, j.replica_num) for j in live}
    next_job = None
    order = [g for g in conf.groups if g.router] + [g for g in conf.groups if not g.router]
    while True:
        short = [g for g in order if count[g.name] < desired.get(g.name, 0)]
        if not short:
            return False
        group = short[0] if short[0].router else min(short, key=lambda g: count[g.name])
        if in_use + group.nodes > budget:
            break
        if next_job is None:
            next_job = rows.next_job_num(run, jobs)
        num = next(n for n in range(len(used) + 1) if (group.name, n) not in used)
        used.add((group.name, num))
        rows.add(run, group.name, num, next_job,
                 f"rollout to deployment {run.deployment_num} within max_surge {limit}")
        next_job, in_use, count[group.name] = next_job + group.nodes, in_use + group.nodes, count[group.name] + 1
    old = [j for j in live if j.deployment_num == run.serving_deployment]
    if any(j.drain_at is not None for j in old):
        return False  # a host is being freed: the next pass adds on it
    routers = {g.name for g in conf.groups if g.router}
    serving = [j for j in old if is_head(j) and j.node_group_name not in routers]
    per_group: dict[str, list[Job]] = {}
    for job in serving:
        per_group.setdefault(job.node_group_name, []).append(job)
    candidates = [js for js in per_group.values() if len(js) > 1]
    if not candidates:
        return True
    victim = sorted(max(candidates, key=len), key=lambda j: (is_ready(j), -j.job_num))[0]
    rows.drain(victim, f"rollout to deployment {run.deployment_num} within max_surge {limit}: deployment "
                       f"{run.serving_deployment} shrinks as it grows", others.get(replica_nodes.key(victim), []))
    return False


def _serving_hosts(run: Run) -> int:
    """The hosts the serving deployment's wanted replicas take (its configuration, kept in the rollout record)."""
    restore = run.rollout or {}
    old = stored_run(restore.get("configuration"))
    nodes = {g.name: g.nodes for g in old.groups} if isinstance(old, StoredService) else {}
    return sum(int(n) * nodes.get(name, 1) for name, n in (restore.get("desired_replicas") or {}).items())


def may_switch_short(run: Run, conf: StoredService, live: list[Job]) -> bool:
    """Under max_surge, when the new deployment can grow no further: each of its groups that wants
    replicas has a ready head (the rest come once the serving deployment has stopped)."""
    for group in conf.groups:
        if int((run.desired_replicas or {}).get(group.name, 0)) and not any(
                j.node_group_name == group.name and j.deployment_num == run.deployment_num and j.drain_at is None
                and is_head(j) and is_ready(j) for j in live):
            return False
    return True
