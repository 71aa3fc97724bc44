"""The provisioning chain: a released job claims itself, finds capacity, and unlocks the next jobs."""

from __future__ import annotations

import logging
from functools import partial

from django.db import transaction
from django.db.models import Case, Value, When

from backends.base import BackendError
from backends.registry import fleet_backend_config, get_compute
from engine import claims, messages, pods
from engine.job_outcome import job_outcome
from engine.nudges import is_service
from engine.submitted import (
    fanout,
    gang,
    placement,
    preemption,
    reclaim,
    replica_placement,
    together,
    waiting,
)
from engine.tuning import GATHERED, NO_CAPACITY_MESSAGE_LIMIT
from instances import fit_reasons, fitting, shares, spanning
from instances.models import Fleet
from muster import compiled, step_reads
from muster.claimable import Lease
from runs.choices import JobReason, JobStatus, RunStatus
from runs.configuration.stored import run_configuration
from runs.models import Job, Run
from runs.transitions import end_job, move_job, move_run

log = logging.getLogger(__name__)


# the run's user too: placement asks whether its runs may go to local fleets
_RELATED = ("run", "run__project", "run__fleet", "run__user", "instance", "fleet")
_JOB = compiled.Select(lambda pk: Job.objects.select_related(*_RELATED).filter(pk=pk), int)  # compiled once


def provision_job(job_id: int) -> bool:
    """Task body. Returns True when this call did the provisioning attempt."""
    with messages.gathered(GATHERED):  # a gang's starts go to advance_jobs together
        return claims.claimed(Job, job_id, "provision_job", _provision, status=JobStatus.SUBMITTED,
                              waiting_master_job=False) is not None


def provision_jobs(job_ids: list[int], fleet: Fleet | None = None) -> tuple[dict[int, int], set[int]]:
    """provision_job for several jobs in one step (the fleet's admission look places the runs it
    chose this way, engine/admission.py): claimed together, read in one query, each attempted as
    provision_job would, in the order given (an error backs off that job alone), given back
    together. `fleet`: the look's; the runs alike that may go only to it are placed on it together
    first (engine/submitted/together.py). Returns ({id placed: the fleet it went to}, the ids this
    step held): one it held and did not place waits again (or ended), as after its own step; one it
    could not claim is another step's."""
    due = Job.objects.filter(pk__in=job_ids, status=JobStatus.SUBMITTED, waiting_master_job=False)
    placed: dict[int, int] = {}
    with messages.gathered(GATHERED):
        held = claims.claimed_batch(due, len(job_ids), "provision_job",
                                    partial(_provision_each, job_ids, placed, fleet=fleet))
    return {pk: fleet for pk, fleet in placed.items() if pk in held.applied}, set(held.pks)


def recheck_jobs(job_ids: list[int]) -> set[int]:
    """The sweep's rechecks of jobs waiting for a host (engine/sweeps.py), as one claimed step: each
    attempted as its own provision_job would (a recheck: it leaves hosts the fleet's look offers
    to the look), the fleets, their quotas and the look's queue read once for the batch rather
    than once per job (muster/step_reads.py). Returns the ids this step held."""
    due = Job.objects.filter(pk__in=job_ids, status=JobStatus.SUBMITTED, waiting_master_job=False)
    with messages.gathered(GATHERED):
        held = claims.claimed_batch(due, len(job_ids), "recheck_jobs",
                                    partial(_provision_each, job_ids, {}, recheck=True))
    return set(held.pks)


def _provision_each(order: list[int], placed: dict[int, int], held: claims.Held, recheck: bool = False,
                    fleet: Fleet | None = None) -> dict:
    jobs = {j.pk: j for j in Job.objects.select_related(*_RELATED).filter(pk__in=held.pks)}
    outcomes = {}
    with step_reads.kept():  # the fleets, a shared fleet's quotas and usage: read once for the batch's choices
        for job, host in together.in_order(fleet, [jobs[pk] for pk in order if pk in jobs], held.lease):
            pk = job.pk
            if host is not None:  # placed with the runs alike beside it in the order
                outcomes[pk] = _outcome(job, {})
                placed[pk] = fleet.pk
                continue
            with held.row(pk):
                waits = recheck and job.waiting_for.startswith(waiting.PREFIX)
                outcomes[pk] = _outcome(job, _attempt(job, held.lease, recheck=waits))
                if job.status == JobStatus.PROVISIONING:
                    placed[pk] = job.fleet_id or job.run.fleet_id
    return outcomes


def _provision(held: claims.Held) -> claims.Outcome:
    job = _JOB.get(held.pk)
    with step_reads.kept():  # the choice, the wait and its words ask the fleets and their quotas once
        return _outcome(job, _attempt(job, held.lease, recheck=job.waiting_for.startswith(waiting.PREFIX)))


def _outcome(job: Job, fields: dict | claims.Outcome) -> claims.Outcome:
    if isinstance(fields, claims.Outcome):  # the attempt's last move is the give-back itself
        return fields
    # A placed job's advance_job leaves only once the lease is given back: sent from inside the
    # attempt, it could reach an idle worker while this step still held the job, bounce off the
    # claim and leave the job to the sweep (three sweep intervals later).
    then = (partial(messages.advance_job, job.pk),) if job.status == JobStatus.PROVISIONING else ()
    return job_outcome(job, then, **fields)


def _attempt(job: Job, lease: Lease, recheck: bool = False) -> dict | claims.Outcome:
    """Place the job; returns the fields its give-back writes (a wait for a host: engine/submitted/waiting.py),
    or the Outcome whose move gives it back (a job 0 that fails for no capacity ends as it is given back).
    `lease`: provision_job's hold on the job, which each of its moves takes. `recheck`: the job waits
    for a host and this is its own look (the sweep's), not its fleet's admission look."""
    run = job.run
    if run.stop_requested or run.status not in (RunStatus.SUBMITTED, RunStatus.PROVISIONING, RunStatus.RUNNING):
        return {}  # the run is ending; process_run terminates this job
    if is_service(run):  # each replica on its own: no gang across replicas
        return replica_placement.place_replica(job, lease)
    if job.instance_id is not None:  # a group master's batch already gave this job its host
        with transaction.atomic():
            move_job(job, JobStatus.PROVISIONING, message=f"provisioning on {job.instance.name} (group batch)",
                     lease=lease)
            fanout.unlock_after_attempt(job)
        return {}
    # A group master reads its siblings once: for the fleet choice, its members and the fan-out.
    siblings = list(run.current_jobs().only(*SIBLING_FIELDS)) if job.node_group_rank == 0 else None
    if run.fleet_id is None:
        usable = fitting.usable_fleets(run)  # read once for the choice, the wait and the failure's words
        fleets = spanning.choose(run, siblings, usable=usable)
        if fleets is None:
            full = waiting.fleets_to_wait_for(run, siblings, usable) if job.job_num == 0 else None
            crowded = waiting.over_cap(job) if full else ""
            if full and not crowded:  # hosts lent to other projects, or a higher priority, may stop preemptible runs
                stopping = reclaim.reclaim_for(job, full, siblings) or preemption.preempt_for(job, full, siblings)
                return waiting.wait(job, spanning.wait_words(run.project_id, full, run, siblings) + stopping, full[0])
            why = f"{spanning.full_fleets(full)}, and {crowded}" if crowded else _no_capacity(run, siblings, usable)
            return claims.Outcome(move=partial(end_job, job, JobReason.FAILED_TO_START_DUE_TO_NO_CAPACITY, why))
        if recheck and waiting.the_look_places(job, fleets):
            return waiting.ask_the_look(job, fleets[0])
        _record_placement(run, job, fleets, siblings)
    fleet = job.fleet or run.fleet  # (a job placed before runs could span fleets has only the run's)
    if job.job_num == 0:
        taken = _take_gang(job, fleet, siblings or [], lease)
        if taken is not True:
            return taken or {}
        if not fitting.is_static(fleet):
            _provision_cloud_group(job, fleet, lease)
    elif fitting.is_static(fleet):
        _take_group(job, fleet, siblings, lease)
    else:
        _provision_cloud_group(job, fleet, lease)
    return {}


SIBLING_FIELDS = ("id", "run_id", "job_num", "node_group_index", "node_group_rank", "node_group_name", "status",
                  "instance_id", "waiting_master_job", "spec", "fleet_id")


def _record_placement(run: Run, job: Job, fleets: list, siblings: list[Job] | None) -> None:
    """Put the run on its fleets: group g's jobs on fleets[g]; the run's own `fleet` is group 0's."""
    names = {f.name for f in fleets}
    groups = run_configuration(run).groups
    if len(names) == 1:
        said = f"placed on fleet {fleets[0].name}"
    else:
        said = "placed across fleets: " + ", ".join(
            f"{groups[g].name if g < len(groups) else g} on {f.name}" for g, f in enumerate(fleets))
    with transaction.atomic():
        if not move_run(run, RunStatus.PROVISIONING, frm=[RunStatus.SUBMITTED], fleet=fleets[0], message=said):
            Run.objects.filter(pk=run.pk, fleet__isnull=True).update(fleet=fleets[0])
            run.refresh_from_db(fields=["fleet"])
        current = Job.objects.filter(run=run, superseded=False)
        if len(names) == 1:
            current.update(fleet=fleets[0])
        else:
            current.update(fleet_id=Case(*[When(node_group_index=g, then=Value(f.pk)) for g, f in enumerate(fleets)]))
    for j in [job, *(siblings or [])]:
        j.fleet = fleets[j.node_group_index]


def _no_capacity(run: Run, siblings: list[Job] | None, usable: list[Fleet]) -> str:
    """The failure message: per group, which requirement no host met (instances/fitting.py `explain`)."""
    jobs = siblings if siblings is not None else list(run.current_jobs().only(*SIBLING_FIELDS))
    groups = fitting.groups_of(jobs, lambda j: j.node_group_name, lambda j: j.node_group_index,
                               lambda j: j.spec["resources"])
    lines = fit_reasons.explain(run.project_id, list(run_configuration(run).fleets), groups, run.configuration,
                            local=fitting.local_allowed(run.user), fleets=usable)
    # a shared fleet whose quota (with all it may borrow) could never hold the run says so
    lines = [*shares.quota_refusals(usable, run.project_id, [(req, n) for _, req, n in groups], at_all=True).values(),
             *lines]
    text = "no fleet can hold every group of this run: " + " | ".join(lines)
    return text if len(text) <= NO_CAPACITY_MESSAGE_LIMIT else text[:NO_CAPACITY_MESSAGE_LIMIT - 3] + "..."


def _on_static_fleet(job: Job, fleets: dict, default: int) -> bool:
    fleet = fleets.get(job.fleet_id or default)
    return fleet is not None and fitting.is_static(fleet)


def _take_gang(master: Job, fleet, siblings: list[Job], lease: Lease) -> bool | dict:
    """Job 0 takes a host for every waiting job of the run's static groups at once, on whichever
    fleets they go to (the gang); a job 0 whose own group is a cloud group takes only the others'.
    False when job 0 ended (a group was short: nothing is taken); the fields of a wait when a
    group was short and the run's retry lets it wait for the hosts (nothing is taken either)."""
    fleets = _fleets_of(siblings, fleet)
    members = sorted((j for j in siblings if j.pk != master.pk and j.status == JobStatus.SUBMITTED
                      and j.instance_id is None and _on_static_fleet(j, fleets, fleet.pk)), key=lambda j: j.job_num)
    gang = [master, *members] if fitting.is_static(fleet) else members
    if not gang:
        return True
    groups: dict[int, list[Job]] = {}
    for j in gang:
        groups.setdefault(j.node_group_index, []).append(j)
    taken, short = placement.take_gang_across([
        (fleets[js[0].fleet_id or fleet.pk], (g, js[0].node_group_name, js[0].spec["resources"], len(js)))
        for g, js in sorted(groups.items())], project_id=master.run.project_id)
    if short:
        if waiting.retry_lets_it_wait(master.run):  # the fleet filled up (or its quota) since it was chosen
            return waiting.wait(master, " | ".join(short), fleet)
        end_job(master, JobReason.FAILED_TO_START_DUE_TO_NO_CAPACITY,
                      f"gang not placed, no host taken: {' | '.join(short)}", lease=lease)
        return False
    given = {g: iter(insts) for g, insts in taken.items()}
    instances = [next(given[j.node_group_index]) for j in gang]
    what = f"the run's {len(groups)} groups" if len(groups) > 1 else f"its group {gang[0].node_group_name}"
    if gang[0] is master:
        return _hold(master, instances, members, what, siblings, lease)
    with transaction.atomic():  # job 0 makes a slice next: the static groups wait on their hosts meanwhile
        # the taken hosts' events go in the members' INSERT
        unused = fanout.place_members(master, members, instances,
                                      taken=f"taken by job {master.run.name}/{master.job_num} for {what}")
        waiting.hand_back(unused, master, "not used: its job ended before it was placed")
    return True


def _fleets_of(jobs: list[Job], fleet) -> dict:
    """The fleets `jobs` go to by pk, read only when this step has not got them in hand already
    (_record_placement gives every sibling its fleet)."""
    cached = Job._meta.get_field("fleet").is_cached
    fleets = {j.fleet_id: j.fleet for j in jobs if j.fleet_id and cached(j)}
    fleets.setdefault(fleet.pk, fleet)
    missing = {j.fleet_id for j in jobs if j.fleet_id} - set(fleets)
    if missing:
        fleets.update((f.pk, f) for f in Fleet.objects.filter(pk__in=missing))
    return fleets


def _take_group(job: Job, fleet, siblings: list[Job] | None, lease: Lease) -> None:
    """A later group master (its group placed again) takes its whole group."""
    members = [j for j in siblings or [] if j.node_group_index == job.node_group_index and j.node_group_rank > 0
               and j.status == JobStatus.SUBMITTED and j.instance_id is None]
    # the fleet's row locked and, on a shared fleet, the project's quota asked under the lock
    # (instances/shares.py `within`), as job 0's gang is: the group's earlier hosts went back
    instances, quota = placement.take_group(
        fleet, (job.node_group_index, job.node_group_name, job.spec["resources"], 1 + len(members)),
        job.run.project_id)
    if not instances:
        why = quota or f"no {1 + len(members)} idle instances of fleet {fleet.name} fit {job.node_group_name}"
        end_job(job, JobReason.FAILED_TO_START_DUE_TO_NO_CAPACITY, why, lease=lease)
        return
    _hold(job, instances, members, f"its group {job.node_group_name}", siblings, lease)


def _hold(job: Job, instances: list, members: list[Job], what: str, siblings: list[Job] | None,
          lease: Lease) -> bool:
    """`job` takes instances[0] and its members the rest, in one transaction with the fan-out."""
    mine, theirs = instances[0], instances[1:]
    with transaction.atomic():
        if not move_job(job, JobStatus.PROVISIONING, instance_id=mine.pk,
                        message=f"provisioning on {mine.name} ({mine.internal_ip})", lease=lease,
                        **waiting.placed(job)):
            # the job moved on under us (stopped): give the hosts back
            waiting.hand_back(instances, job, f"not used: job {job.run.name}/{job.job_num} ended before it was placed")
            return False
        # the taken hosts' events go in the members' INSERT
        unused = fanout.place_members(job, members, theirs, mine=mine,
                                      taken=f"taken by job {job.run.name}/{job.job_num} for {what}")
        waiting.hand_back(unused, job, "not used: its job ended before it was placed")
        fanout.unlock_after_attempt(job, siblings)
    return True


def _provision_cloud_group(job: Job, fleet, lease: Lease) -> None:
    """A backend that creates groups makes the whole group in one call (a TPU pod slice). A slice
    that cannot be had ends the job and lets the run's static hosts go in the same step."""
    compute = get_compute(fleet.backend, fleet_backend_config(fleet))
    group_jobs = list(job.run.current_jobs().filter(node_group_index=job.node_group_index))
    try:
        assigned = pods.reserve_pod(fleet, compute, group_jobs)
    except BackendError as exc:
        _fail_for_good(job, exc.reason, str(exc), lease)
        return
    if not assigned:
        _fail_for_good(job, JobReason.FAILED_TO_START_DUE_TO_NO_CAPACITY,
                       f"fleet {fleet.name} has no offer for {job.node_group_name}", lease)
        return
    with transaction.atomic():
        for other in group_jobs:
            Job.objects.filter(pk=other.pk, instance__isnull=True).update(instance_id=assigned[other.pk])
        move_job(job, JobStatus.PROVISIONING, instance_id=assigned[job.pk],
                 message=f"provisioning {len(group_jobs)} hosts as one group", lease=lease, **waiting.placed(job))
        fanout.unlock_after_attempt(job)


def _fail_for_good(job: Job, reason: str, why: str, lease: Lease) -> None:
    with transaction.atomic():
        end_job(job, reason, why, lease=lease)
        gang.release(job.run, job.submission_num, job.node_group_name, why)
