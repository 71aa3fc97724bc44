"""The safety net: beat runs `sweep` every SWEEP_INTERVAL seconds.

A lost message, a dead worker or a crashed chain leaves a row unleased in a non-final state for
longer than it should; the sweep finds such rows and enqueues their task again. Tasks claim their
rows, so a row enqueued twice is processed once.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db.models import Exists, F, OuterRef, Q
from django.db.models.functions import Coalesce
from django.utils import timezone

from backends.registry import GIVEN_HOSTS
from engine import attach_installs, attach_revokes, messages, pods
from engine.claims import unleased
from engine.nudges import ended_without_failure
from engine.ssh_health import check_ssh_hosts
from engine.submitted import waiting
from engine.tuning import SWEEP_BACKLOG as BACKLOG
from engine.tuning import SWEEP_BATCH as BATCH
from engine.tuning import SWEEP_RECHECK_BATCH as RECHECK_BATCH
from instances.models import Fleet, FleetQueue, FleetStatus, GroupStatus, InstanceGroup
from runs.choices import FAILING_REASONS, JOB_FINISHED, JOB_UNFINISHED, JobStatus, RunStatus
from runs.models import Job, Run


def stale_after() -> timedelta:
    # three sweep intervals: long enough that a healthy chain has moved the row on already
    return timedelta(seconds=3 * float(settings.MUSTER["SWEEP_INTERVAL"]))


def sweep() -> dict[str, int]:
    now = timezone.now()
    old = now - stale_after()
    found = {}
    backlog = messages.queued_messages()
    if backlog is not None and backlog > BACKLOG:
        found["backlog"] = backlog  # messages are late, not lost: re-enqueue nothing this time
    else:
        found.update(_re_enqueue(now, old))
    found["idle"] = pods.expire_idle_pods(now)
    found["ssh_hosts"] = check_ssh_hosts(now)
    return found


def _re_enqueue(now, old) -> dict[str, int]:
    """Rows left without a lease in a non-final state for too long: their task is sent again."""
    found = {}
    # a run waiting for a host of a full fleet is looked at again when its next_check_at is due
    # (engine/submitted/waiting.py): a routine recheck, not a lost message
    submitted = Job.objects.filter(unleased(now), status=JobStatus.SUBMITTED, waiting_master_job=False,
                                   status_changed_at__lt=old).filter(
        Q(next_check_at__isnull=True) | Q(next_check_at__lte=now))
    lost = submitted.exclude(waiting_for__startswith=waiting.PREFIX).values_list("pk", flat=True)[:BATCH]
    found["provision"] = _enqueue(messages.provision_job, lost)
    # the rechecks take turns across projects: one project's thousands of waiting runs do not fill the
    # batch while another project's waiting run is never looked at (engine/submitted/waiting.py)
    # at most RECHECK_BATCH a sweep: a backstop now (the fleets' admission looks offer the hosts given
    # back), and at 10,000 waiting runs a look at each every minute was 167 provisioning attempts a
    # second ahead of every job's end in the broker (bench.queueing)
    # (one message for them all: a recheck batch reads the fleets, their quotas and the look's queue once)
    rechecks = waiting.due_rechecks(submitted, min(BATCH, RECHECK_BATCH))
    messages.recheck_jobs(rechecks)
    found["waiting_rechecks"] = len(rechecks)
    # a fleet whose hosts came back and whose admission look was lost (engine/admission.py)
    looks = FleetQueue.objects.filter(unleased(now), wanted__gt=F("admitted"), fleet__status=FleetStatus.ACTIVE).filter(
        Q(admitted_at__isnull=True) | Q(admitted_at__lt=old)).values_list("pk", flat=True)[:BATCH]
    found["admissions"] = _enqueue(messages.admit_fleet, looks)
    # A job never looked at yet is stale by the age of its status, not at once. Running jobs are
    # the batch watcher's (engine/running/watch.py): it claims whatever is due, and one watch
    # message (below), not one per job, is what the sweep sends for them.
    watched = Job.objects.filter(unleased(now), status__in=[JobStatus.PROVISIONING, JobStatus.PULLING]).filter(
        Q(next_check_at__lt=old) | Q(next_check_at__isnull=True, status_changed_at__lt=old)
    ).values_list("pk", flat=True)[:BATCH]
    found["advance"] = _enqueue(messages.advance_job, watched)
    # Running jobs are looked at only by beat's batch watch, whose tick is dropped when it waits in a
    # backlog past its expiry (so that ticks never pile up): a busy worker dropped every tick, and no
    # running job was looked at until the backlog cleared (a router waited out its peers' limit for
    # workers whose probes had passed). Jobs overdue by three sweep intervals get one watch sent.
    overdue = Job.objects.filter(unleased(now), status=JobStatus.RUNNING, runner_submitted=True,
                                 instance__isnull=False).filter(
        Q(next_check_at__lt=old) | Q(next_check_at__isnull=True, status_changed_at__lt=old)).exists()
    found["watch"] = _enqueue(lambda _: messages.watch_running(), [None] if overdue else [])
    ending = Job.objects.filter(unleased(now), status=JobStatus.TERMINATING,
                                status_changed_at__lt=old).values_list("pk", flat=True)[:BATCH]
    found["finish"] = _enqueue(messages.finish_job, ending)
    runs = runs_to_derive(now, old)
    lost, routine, retries = _runs_by_why(runs, changed_statuses(runs, old))
    found["runs"] = _enqueue(messages.process_run, lost)
    # sent as well, but no message was lost: /metrics does not count these as recoveries
    found["runs_routine"] = _enqueue(messages.process_run, routine)
    found["retries"] = _enqueue(messages.process_run, retries)
    groups = InstanceGroup.objects.filter(unleased(now), status=GroupStatus.TERMINATING,
                                          updated__lt=old).values_list("pk", flat=True)[:BATCH]
    found["groups"] = _enqueue(messages.terminate_group, groups)
    found["pods"] = _enqueue(lambda pk: messages.poll_pod(pk, 0), pods.pods_to_poll(now))
    # an SSH fleet pending that long is not being registered (its registration holds a lease)
    fleets = Fleet.objects.filter(unleased(now), status=FleetStatus.PENDING, backend=GIVEN_HOSTS,
                                  created__lt=old).values_list("pk", flat=True)[:BATCH]
    found["fleets"] = _enqueue(messages.register_fleet, fleets)
    # a fleet whose deletion was asked for and that nobody is deleting (the step holds a lease)
    ending = Fleet.objects.filter(unleased(now), status=FleetStatus.TERMINATING).values_list("pk", flat=True)[:BATCH]
    found["fleet_deletions"] = _enqueue(messages.delete_fleet, ending)
    # attach lines not installed yet: the message was lost, or the host did not answer and the try backed off
    found["attach_installs"] = _enqueue(messages.install_attach_key, attach_installs.grants_due(now, old))
    # attach lines whose removal failed (the host was down): once it answers again
    found["attach_revokes"] = _enqueue(messages.revoke_attach_keys, attach_revokes.instances_with_due_revokes(now))
    return found


def _nudged(job: tuple[str, str], run_status: str) -> bool:
    """Whether a job now in this (status, reason) got there by a move that nudged its run
    (engine.nudges.may_change_run): if so and the run was not derived after it, a message was lost."""
    status, reason = job
    return status in JOB_FINISHED or (status == JobStatus.TERMINATING and reason in FAILING_REASONS) or (
        status == JobStatus.PROVISIONING and run_status == RunStatus.SUBMITTED)


def _runs_by_why(rows, changed: dict[int, set[tuple[str, str]]]) -> tuple[list[int], list[int], list[int]]:
    """The runs to derive, split by why: a lost nudge or an unanswered stop; a job move that nudges
    nobody by design (pulling, running, a finished runner's terminating), which the sweep derives as
    its routine; a retry whose backoff is over, which only the sweep sends."""
    lost, routine, retries = [], [], []
    for pk, status, stop in rows:
        if status == RunStatus.PENDING:
            retries.append(pk)
        elif (stop and status != RunStatus.TERMINATING) or any(_nudged(s, status) for s in changed.get(pk, ())):
            lost.append(pk)
        else:
            routine.append(pk)
    return lost, routine, retries


def runs_to_derive(now, old):
    """Runs that process_run should have looked at by now and may not have (a lost nudge).

    A run is derived when one of its jobs changed after its last derivation, when a stop asked for
    is not acted on yet (or its teardown waits), when a service was updated after it, or when its
    retry is due. A running run whose
    jobs are quiet is not looked at at all, so the cost of the sweep follows what changes, not how
    many runs are running.
    """
    active = [RunStatus.SUBMITTED, RunStatus.PROVISIONING, RunStatus.RUNNING, RunStatus.TERMINATING]
    # changed long enough ago that its own nudge should have come
    jobs = Job.objects.filter(run_id=OuterRef("pk"), superseded=False, status_changed_at__lt=old)
    # A run never derived is due once a job of it left `submitted`: a job still there (a run waiting
    # for a host) would derive to what the run already is, and at 10,000 waiting runs that was one
    # process_run per waiting run, spent while hosts were being handed over (bench.queueing). A lost
    # provisioning message of such a job is the sweep's `provision` recovery, not a derive's.
    job_changed = (Q(derived_at__isnull=False) & Exists(jobs.filter(status_changed_at__gte=OuterRef("derived_at")))
                   | Q(derived_at__isnull=True) & Exists(jobs.exclude(status=JobStatus.SUBMITTED)))
    # a service updated after its last derivation (the update's nudge bounced off a process_run)
    updated = Q(updated_at__lt=old) & (Q(derived_at__isnull=True) | Q(updated_at__gte=F("derived_at")))
    stale = Q(derived_at__isnull=True) | Q(derived_at__lt=old)
    waiting = (~Q(stop_requested="") | Q(status=RunStatus.TERMINATING)) & stale
    return list(Run.objects.filter(unleased(now)).filter(
        Q(status__in=active) & (job_changed | waiting | updated) | Q(status=RunStatus.PENDING, next_retry_at__lte=now)
        # a group restart whose backoff is over (engine/restarts.py): only the sweep sends it
        | Q(status__in=active, next_retry_at__lte=now)
    ).values_list("pk", "status", "stop_requested")[:BATCH])


def changed_statuses(runs, old) -> dict[int, set[tuple[str, str]]]:
    """What the jobs that changed since their run's last derivation (and before `old`) are now
    (status, reason), per run: one query for all the runs found, only when some were."""
    found: dict[int, set[tuple[str, str]]] = {}
    if not runs:
        return found
    ids = [pk for pk, _, _ in runs]
    rows = Job.objects.filter(
        run_id__in=ids, superseded=False,
        status_changed_at__gte=Coalesce(F("run__derived_at"), F("run__submitted_at")), status_changed_at__lt=old)
    # a job that ended without a failure while others of its run still run nudged nobody
    # (engine.nudges.matters_only_last): its run is derived as routine, not as a lost message
    running_on = set(Job.objects.filter(run_id__in=ids, superseded=False, status__in=JOB_UNFINISHED)
                     .values_list("run_id", flat=True).distinct())
    for run_id, status, reason in rows.values_list("run_id", "status", "termination_reason").distinct():
        if run_id in running_on and ended_without_failure(status, reason):
            continue
        found.setdefault(run_id, set()).add((status, reason))
    return found


def _enqueue(send, pks) -> int:
    n = 0
    for pk in pks:
        send(pk)
        n += 1
    return n
