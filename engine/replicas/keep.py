"""A service run kept at its replicas: process_run's derive for `type: service` (engine/processing.py).

A service runs until it is stopped: its replicas ending never ends it, and it may have none (scaled
to zero). Each pass, under process_run's hold on the run, and safe to repeat:

1. ended replicas: a drained one (drain_at) or one of an older deployment is left behind
   (superseded); a failed one of the current deployment is replaced by a new submission of it
   once the back-off of its failures in a row is over (engine/restarts.py's steps, 15 s doubling
   to 10 min), if the run's `retry` lists its event within `retry.duration` (as a task's run
   retries); without `retry` the failure fails the service, as dstack does. A replica whose
   commands exit 0 is started again after the same back-off (a service does not finish).
2. per replica group, the count follows desired_replicas: replicas are added (a new deployment's
   one at a time while old ones remain: the surge of one), and removed newest first, never taking
   the ready count below what the group wants while old replicas are rolled out (one old replica at
   a time, once a new one is ready); a removed replica leaves the pool at once and is stopped a
   drain delay later (rows.drain, MUSTER_DRAIN_DELAY), and in a PD service not before its routers
   dropped it (bounded: engine/tuning.py ROUTER_DRAIN_WAIT; serving/router_sync.py).
   A service with a `router` group is updated blue/green per deployment instead
   (engine/replicas/revisions.py): the newest deployment's groups are counted here, the serving one
   is kept until the switch, any other is drained.
3. the run's status: `running` from its first running replica (or at once when it wants none) to
   its stop, whatever number of replicas is ready meanwhile (the API's service.replicas says that).

A multi-host replica (`nodes: N`) is kept as one: only its node 0 counts and is drained, its other
nodes going with it; any node ending stops the others (the replica restarts as one, as LWS's
RecreateGroupOnPodRestart), and once all have ended they get a new submission together after the
back-off: on the same hosts after an error (kept busy meanwhile, `Job.keep_host`), on new ones after
an interruption or when a host is gone (engine/replicas/nodes.py).

When something is due later (a back-off, a drain), the run's next_retry_at says when: the sweep
derives it again then (engine/sweeps.py).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.utils import timezone

from engine import outcome
from engine.nudges import is_routed
from engine.replicas import nodes as replica_nodes
from engine.replicas import revisions, rows
from engine.restarts import backoff
from engine.tuning import ROUTER_DRAIN_WAIT, ROUTER_RECHECK
from muster.claimable import Lease
from runs.choices import FAILING_REASONS, RETRY_EVENT, JobReason, JobStatus, RunStatus
from runs.configuration.stored import StoredService, run_configuration
from runs.limits import retry_duration
from runs.models import Job, Run
from runs.transitions import move_run, terminate_job
from serving.replicas import is_head, is_ready
from serving.router_sync import still_listed

STARTING_RUN = (RunStatus.SUBMITTED, RunStatus.PROVISIONING)


def keep(run: Run, jobs: list[Job], lease: Lease) -> Job | None:
    """One pass (module docstring). Returns the failed replica that fails the service (no retry
    lets it be replaced), for process_run to tear the run down with; None otherwise."""
    conf = run_configuration(run)
    assert isinstance(conf, StoredService)
    now = timezone.now()
    due: list[datetime] = []
    pending: dict[str, list[int]] = {}  # group -> replica_nums of replicas just replaced or waiting to be
    failed_new = revisions.failed_new(run, jobs) if conf.routed else None
    if failed_new is not None:  # a routed service's rollout failed: back to the deployment that serves
        if not revisions.roll_back(run, revisions.failure(failed_new)):
            return None  # an update came in between: the next pass works from it
        conf = run_configuration(run)
        assert isinstance(conf, StoredService)
    units = replica_nodes.multi_node(jobs)
    for job in [j for j in jobs if j.finished and replica_nodes.key(j) not in units]:
        cause = _ended(run, conf, job, now, due, pending)
        if cause is not None:
            return cause
    for nodes in units.values():
        cause = _ended_replica(run, conf, nodes, jobs, now, due, pending)
        if cause is not None:
            return cause
    live = [j for j in jobs if not j.finished and not j.superseded]
    counted = live
    if conf.routed and revisions.rolling_out(run):
        give_up = revisions.deadline(run, conf)
        if give_up is not None and give_up <= now:
            if not revisions.roll_back(run, revisions.overdue(run, live)):
                return None
            conf = run_configuration(run)
            assert isinstance(conf, StoredService)
        elif give_up is not None:
            due.append(give_up)
    # blue/green: the groups of the newest deployment are counted, the others kept or drained
    revisions.drain_others(run, live, conf.routed)
    if conf.routed:
        counted = [j for j in live if j.deployment_num == run.deployment_num]
    others = replica_nodes.others_of(live)
    surge = revisions.max_surge(conf) if conf.routed and revisions.rolling_out(run) else None
    stuck = surge is not None and revisions.grow_within_surge(run, conf, live, jobs, surge, others)
    for group in conf.groups if surge is None else ():
        # a multi-host replica restarting as one counts once, as `pending`, while its nodes stop
        restarting = pending.get(group.name, [])
        heads = [j for j in counted if j.node_group_name == group.name and is_head(j)
                 and j.replica_num not in restarting]
        # the replica numbers of the group's other deployments stay taken, and those of a removed
        # multi-host replica whose node 0 has ended while another node still stops: a number is used
        # again only once every node of its replica has ended
        taken = {j.replica_num for j in live if j.node_group_name == group.name and (j not in counted or not is_head(j))}
        # such a replica's hosts are not free yet either
        stopping = {replica_nodes.key(j) for j in counted if j.node_group_name == group.name} \
            - {replica_nodes.key(j) for j in jobs if is_head(j) and not j.superseded}
        _follow_count(run, group.name, heads, pending.get(group.name, []), jobs, group.nodes, others, taken,
                      len(stopping))
    if conf.routed and revisions.rolling_out(run):
        due_now = revisions.switch_due(run, conf, live, stuck)
        if due_now and revisions.switch(run):
            revisions.drain_others(run, live, True)
        elif due_now is None:  # ready, but not all listed by the new routers yet: look again soon
            due.append(now + timedelta(seconds=ROUTER_RECHECK))
    head_of = {replica_nodes.key(j): j.pk for j in live if is_head(j)}  # routers list a replica by its node 0
    for job in live:
        if job.drain_at is not None and job.status == JobStatus.RUNNING:
            _stop_drained(run, job, head_of.get(replica_nodes.key(job), job.pk), now, due)
    _status(run, live, lease)
    if due:
        outcome.learn(run, next_retry_at=min(due))  # written with process_run's give-back
    elif run.next_retry_at is not None:
        outcome.learn(run, next_retry_at=None)
    return None


def _stop_drained(run: Run, job: Job, head: int, now, due: list) -> None:
    """A drained replica is stopped a drain delay after it left the pool, and not before its
    service's routers stopped listing it (serving/router_sync.py: they would send it requests as
    it stops); ROUTER_DRAIN_WAIT later it is stopped anyway, and the event says which still did."""
    stop_at = job.drain_at + timedelta(seconds=rows.drain_delay())
    if stop_at > now:
        due.append(stop_at)
        return
    listing = still_listed(run.pk, head) if is_routed(run) else []
    bound = stop_at + timedelta(seconds=ROUTER_DRAIN_WAIT)
    if listing and now < bound:
        due.append(min(bound, now + timedelta(seconds=2)))  # the sync nudges process_run once they dropped it
        return
    why = "drained: stopped after the drain delay"
    if listing:
        why += (f"; router job(s) {', '.join(listing)} still listed it {ROUTER_DRAIN_WAIT:.0f}s after that: "
                "stopped anyway")
    terminate_job(job, JobReason.TERMINATED_BY_SERVER, why)


def _ended(run: Run, conf: StoredService, job: Job, now, due: list, pending: dict) -> Job | None:
    # another deployment's: an older one rolled out, or a newer one rolled back. A routed service's
    # serving replica ending during a rollout is not replaced either: a new replica starts with the
    # run's configuration, the new deployment's (the switch, or the rollback's restored configuration,
    # brings the count back)
    if job.drain_at is not None or job.deployment_num != run.deployment_num \
            or conf.replica_group(job.node_group_name) is None:
        rows.supersede(job)  # removed on purpose, or rolled out: nothing to replace
        return None
    failed = job.termination_reason in FAILING_REASONS
    if failed and not _retry_allows(run, conf, job):
        return job
    wait = backoff(_failures_in_a_row(job))
    at = job.status_changed_at + wait
    pending.setdefault(job.node_group_name, []).append(job.replica_num)
    if at > now:
        due.append(at)
        return None
    why = f"{job.termination_reason or job.status} after a back-off of {wait.total_seconds():.0f}s"
    new = rows.replace(run, job, why)
    if new is not None:
        outcome.learn(run, submission_num=max(run.submission_num, new.submission_num))
    return None


def _ended_replica(run: Run, conf: StoredService, nodes: list[Job], jobs: list[Job], now, due: list,
                   pending: dict) -> Job | None:
    """Step 1 for a multi-host replica with an ended node (`nodes`: its current jobs, in rank order;
    `jobs`: the run's)."""
    ended = [j for j in nodes if j.finished]
    head = nodes[0]
    # (a unit without its node 0: what is left of a removed replica, its node 0 let go already)
    if any(j.drain_at is not None for j in nodes) or head.deployment_num != run.deployment_num \
            or conf.replica_group(head.node_group_name) is None or not is_head(head):
        replica_nodes.let_go(nodes, ended)  # removed on purpose, or rolled out: nothing to replace
        return None
    if _surplus(run, head, jobs, pending):
        # scaled down meanwhile: the replica to remove is this one, which serves nothing, and its kept
        # hosts (a TPU replica's slice) are given back now rather than after a restart
        replica_nodes.let_go(nodes, ended)
        return None
    cause = replica_nodes.cause_of(ended)
    pending.setdefault(head.node_group_name, []).append(head.replica_num)
    if len(ended) < len(nodes):
        replica_nodes.stop_the_rest(nodes, cause)
        return None
    if cause.termination_reason in FAILING_REASONS and not _retry_allows(run, conf, cause):
        return cause
    wait = backoff(_failures_in_a_row(head))
    at = max(j.status_changed_at for j in nodes) + wait
    if at > now:
        due.append(at)
        return None
    fresh = replica_nodes.restart(run, nodes, cause, f"{replica_nodes.said(cause)}, after a back-off of "
                                                     f"{wait.total_seconds():.0f}s")
    if fresh:
        outcome.learn(run, submission_num=max(run.submission_num, fresh[0].submission_num))
    return None


def _surplus(run: Run, head: Job, jobs: list[Job], pending: dict) -> bool:
    """Whether the group has the replicas it wants without this one: its current deployment's
    serving node 0s and the replicas restarting already."""
    group = head.node_group_name
    serving = [j for j in jobs if j.node_group_name == group and is_head(j) and j.pk != head.pk and not j.finished
               and not j.superseded and j.deployment_num == run.deployment_num and j.drain_at is None]
    return len(serving) + len(pending.get(group, [])) >= int((run.desired_replicas or {}).get(group, 0))


def _retry_allows(run: Run, conf: StoredService, job: Job) -> bool:
    """As a task's run retries (engine/processing.py): the event listed, the next attempt inside
    retry.duration (counted from the run's submission for no-capacity, from this failure otherwise)."""
    event = RETRY_EVENT.get(job.termination_reason)
    if conf.retry is None or event is None or event not in conf.retry.on_events:
        return False
    now = timezone.now()
    since = run.submitted_at if event == "no-capacity" else now
    return now + backoff(_failures_in_a_row(job)) < since + timedelta(seconds=retry_duration(conf))


def _failures_in_a_row(job: Job) -> int:
    """1 + the replica's earlier submissions that ended without ever being ready, back to the
    last one that was (a replica that served, then failed, waits the first back-off only)."""
    if job.first_ready_at is not None:
        return 1
    earlier = Job.objects.filter(run_id=job.run_id, job_num=job.job_num, submission_num__lt=job.submission_num) \
        .order_by("-submission_num").values_list("first_ready_at", flat=True)[:32]
    count = 1
    for ready in earlier:
        if ready is not None:
            break
        count += 1
    return count


def _follow_count(run: Run, group: str, live: list[Job], replacing: list[int], jobs: list[Job], nodes: int,
                  others: dict, taken: set[int], stopping: int = 0) -> None:
    """Step 2 for one replica group; `live`: its replicas' node 0s; `replacing`: the replica numbers of
    its replicas step 1 replaced or will replace after their back-off (they count as the current
    deployment's); `nodes`: the jobs of a new replica; `others`: a multi-host replica's other nodes;
    `taken`: replica numbers held by the group's replicas of other deployments and by removed replicas
    with a node still stopping; `stopping`: how many such removed replicas hold hosts still."""
    pending = len(replacing)
    desired = int((run.desired_replicas or {}).get(group, 0))
    serving = [j for j in live if j.drain_at is None]
    new = [j for j in serving if j.deployment_num >= run.deployment_num]
    old = [j for j in serving if j.deployment_num < run.deployment_num]
    old_draining = any(j.drain_at is not None and j.deployment_num < run.deployment_num for j in live)
    holding = sum(1 for j in live if j.drain_at is not None) + stopping  # draining: their hosts are not free yet
    ready = sum(1 for j in serving if is_ready(j))
    # newest first, those not serving yet before those that are
    newest_first = sorted(new, key=lambda j: (is_ready(j), -j.job_num))
    for job in newest_first[:max(0, len(new) + pending - desired)]:
        was_ready = is_ready(job)
        if rows.drain(job, f"scaled to {desired} replicas of {group}", others.get(replica_nodes.key(job), [])):
            ready -= was_ready
            new.remove(job)
    if old and not old_draining and len(new) + pending + len(old) > desired:
        victim = sorted(old, key=lambda j: (is_ready(j), j.job_num))[0]
        # one old replica at a time, and only while the others ready cover what the group wants
        if ready - is_ready(victim) >= min(desired, ready) and rows.drain(
                victim, f"rolled out: deployment {run.deployment_num} replaces deployment {victim.deployment_num}",
                others.get(replica_nodes.key(victim), [])):
            old.remove(victim)
            old_draining, holding = True, holding + 1  # its host is busy until it has stopped
    # the surge of one: while a rollout is under way (old replicas serve or drain) one replica more
    # than wanted holds a host at most, so an update needs one spare host, not a second fleet
    rolling = bool(old) or old_draining
    surge = 1 if rolling else 0
    held = len(old) + (holding if rolling else 0)
    used = {j.replica_num for j in live} | set(replacing) | taken
    next_job = None
    count = len(new) + pending
    while count < desired and count + held < desired + surge:
        if next_job is None:  # read only when a replica is added
            next_job = rows.next_job_num(run, jobs)
        num = next(n for n in range(len(used) + 1) if n not in used)
        used.add(num)
        why = f"rolling update to deployment {run.deployment_num}" if rolling else f"{group} wants {desired}"
        rows.add(run, group, num, next_job, why)
        next_job += nodes
        count += 1


def _status(run: Run, live: list[Job], lease: Lease) -> None:
    """Step 3: `running` from the first running replica, or at once when the service wants none."""
    if run.status not in STARTING_RUN:
        return
    wants_none = not any((run.desired_replicas or {}).values())
    if wants_none or any(j.status == JobStatus.RUNNING for j in live):
        move_run(run, RunStatus.RUNNING, frm=list(STARTING_RUN), lease=lease,
                 message="running: scaled to zero, a request brings a replica up" if wants_none and not live else "")
    elif any(j.status in (JobStatus.PROVISIONING, JobStatus.PULLING) for j in live) \
            and run.status == RunStatus.SUBMITTED:
        move_run(run, RunStatus.PROVISIONING, frm=[RunStatus.SUBMITTED], lease=lease)
