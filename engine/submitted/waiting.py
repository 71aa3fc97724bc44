"""A run that finds its fleet full waits for a host instead of failing its attempt.

Without this, a run whose `retry` lists `no-capacity` fails its attempt on a full fleet, is torn
down, goes `pending` and is resubmitted after the backoff: about six tasks an attempt, with the
backoff growing to ten minutes, so at a steady 1.5 runs/s a full fleet of 32 never drained
(bench/soak.py). A run waits here when three things hold:

- its `retry` lists `no-capacity` (without it a full fleet fails the run at once, as before);
- it is still inside `retry.duration`, counted from its submission as dstack counts no-capacity;
- some fleet it may use would hold it once that fleet's busy hosts are free again (a run that
  could never fit fails at once with the reasons, as before).

While it waits, job 0 stays `submitted` and holds no host: its `waiting_for` says which fleet is
full (the API's status_message and the console show it), and its `next_check_at` is when the sweep
looks again. Hosts given back by the engine (a job's end, a placement that did not happen) while
any job waits send their fleet's admission look (engine/admission.py), which wakes the waiting jobs the idle hosts can
hold, in queue order (runs/queue.py: the highest `priority`, then the oldest); the sweep's recheck
is the backstop for a lost wake, a host added or one back from unreachable. Past `retry.duration` the attempt
fails and the run ends `retry_limit_exceeded`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from functools import partial

from django.conf import settings
from django.db import transaction
from django.db.models import F, Window
from django.db.models.functions import RowNumber
from django.utils import timezone

from engine import messages
from engine.job_outcome import job_outcome, learn
from engine.nudges import is_service
from engine.outcome import Outcome
from engine.tuning import ADMISSION_GATHER_SECONDS as GATHER_SECONDS
from engine.tuning import ADMISSION_READ_MARGIN as READ_MARGIN
from instances import fitting, fleet_queue, spanning
from instances.transitions import hand_back as give_back
from muster.step_reads import once
from runs import admission, admission_order, queue
from runs import limits as run_limits
from runs.choices import WAITING_FOR_HOST
from runs.models import Job, Run
from runs.waits import gives_up_at

PREFIX = WAITING_FOR_HOST


def retry_lets_it_wait(run: Run) -> bool:
    if not spanning.waits_on_full_fleet(run.configuration):
        return False
    until = gives_up_at(run)
    return until is None or timezone.now() < until  # None: past the calendar's end, it waits as long as it takes


def fleets_to_wait_for(run: Run, jobs: list[Job] | None, usable: list | None = None) -> list | None:
    """The fleets the run would get once their busy hosts are free, if it may wait for them
    (`usable`: fitting.usable_fleets(run), when the caller has read it)."""
    if not retry_lets_it_wait(run):
        return None
    return spanning.choose(run, jobs, busy_too=True, usable=usable)


def wait(job: Job, why: str, fleet=None) -> dict:
    """The fields job 0's give-back writes while it waits (claims.Outcome fields); `fleet`: the one
    it waits for, kept in `Job.waiting_fleet` while it waits (which fleet's quota or hosts hold it)."""
    text = f"{PREFIX}: {why}"
    text = text[:Job._meta.get_field("waiting_for").max_length]
    if text != job.waiting_for:  # said once, not on every look: with the give-back
        learn(job, event=f"waiting for {text}")
    job.waiting_for = text
    recheck = float(settings.MUSTER["WAITING_HOST_RECHECK"])
    return {"waiting_for": text, "next_check_at": timezone.now() + timedelta(seconds=recheck),
            "waiting_fleet_id": fleet.pk if fleet is not None else None}


def placed(job: Job) -> dict:
    """The fields that end a wait, for the move to provisioning, with how long it waited (since its job
    was made, as `muster queue` counts it). Written by the UPDATE that places the job, so a wait is
    recorded once, only for a placement that happened, whichever worker placed it: /metrics reads
    them from the table (console/queue_metrics.py)."""
    if not job.waiting_for.startswith(PREFIX):
        return {}
    return {"waiting_for": "", "next_check_at": None, "waiting_fleet_id": None,
            "host_wait": max(timezone.now() - job.created, timedelta(0))}


def hand_back(instances, job=None, message: str = "", project_id: int | None = None) -> set[int]:
    """instances.transitions.hand_back, and after commit each fleet that got hosts back has its
    admission look (engine/admission.py), which wakes the waiting runs they go to."""
    freed = give_back(instances, job, message)
    if freed:
        transaction.on_commit(lambda: _released(instances, freed))
    return freed


def _released(instances, freed: set[int]) -> None:
    """After a release's commit: the look of each fleet that got hosts back, when any run waits.
    With nobody waiting a look would wake nobody: one read instead of the release's count, the
    look's message and its step (a third of the engine's CPU per job when nothing waits). A run
    that starts waiting at the same moment is the same race as a look that read the queue just
    before its wait was written: its own recheck (the sweep's backstop) places it."""
    if _gathering.fleets is None and not queue.anyone_waiting():
        return
    # the hosts' fleets as the caller loaded them (a deferred fleet_id is read instead, once)
    known = {inst.pk: inst.__dict__["fleet_id"] for inst in instances if "fleet_id" in inst.__dict__}
    fleets = ({known[pk] for pk in freed if known[pk] is not None} if freed <= set(known)
              else fleet_queue.fleets_of(freed))
    if _gathering.fleets is not None:
        _gathering.fleets |= set(fleets)
        return
    released(fleets)


class _Gathering(threading.local):
    fleets: set[int] | None = None


_gathering = _Gathering()  # per thread, as Django's connections are


@contextmanager
def releases_gathered() -> Iterator[None]:
    """Around a step that gives back many hosts, each in its own transaction (engine/finishing.py
    `finish_jobs`): their fleets' looks are asked for once it is over, as one release, not after
    each commit (a read of the queue and a write of the fleet's row each). Asked for even when the
    step failed half-way: what it committed gave those hosts back. Nested, the outermost asks."""
    if _gathering.fleets is not None:
        yield
        return
    _gathering.fleets = set()
    try:
        yield
    finally:
        fleets, _gathering.fleets = _gathering.fleets, None
        if fleets:
            transaction.on_commit(lambda: queue.anyone_waiting() and released(fleets))


def released(fleet_ids) -> None:
    """After a release's commit: each fleet's row counts one more release, and its look is sent when
    this is the first release since the last look and no look holds the row (instances/fleet_queue.py
    `want`: the look sent covers the releases after it, a look holding the row sends itself again).
    The look comes GATHER_SECONDS later, so that the releases close behind this one are its too."""
    for fleet_id in fleet_queue.want(fleet_ids):
        messages.admit_fleet(fleet_id, countdown=GATHER_SECONDS)


def the_look_places(job: Job, fleets: list) -> bool:
    """Whether the admission look of the fleet a waiting job would go to now places it or runs
    before it, so that its own recheck, finding room, leaves the choice to the look: a task whose
    every group goes to that one fleet's given hosts (none has a slice to make; engine/admission.py
    places such runs itself), among the runs a look reads first, or behind some of them the idle
    hosts can hold. A run further down behind runs the idle hosts do not fit is placed by its
    recheck, as BestEffortFIFO would: no look reaches it. The heads are read once per step (a batch
    of the sweep's rechecks, engine/submitted/provision.py `recheck_jobs`): on a shared fleet they
    are every sharing project's, and read per job they were half of what a recheck cost there."""
    run, fleet = job.run, fleets[0]
    if len({f.pk for f in fleets}) != 1 or not fitting.is_static(fleet) or is_service(run):
        return False
    heads = once(("heads", fleet.pk, READ_MARGIN), lambda: admission_order.heads_for(fleet, READ_MARGIN))
    if any(h.pk == job.pk for h in heads):
        return True
    return bool(admission.choose(heads, fleet_queue.idle_hosts(fleet), {}, set(), partial(fleet_queue.fitting, fleet)))


def ask_the_look(job: Job, fleet) -> Outcome:
    """A waiting job's recheck that found room on `fleet`: not placed by itself, which would pass
    over the runs before it in the queue (and race the look for the hosts), but by the fleet's look,
    asked as a release asks it (`released`) once this step has given the job back. The job keeps
    waiting until the look places it."""
    recheck = float(settings.MUSTER["WAITING_HOST_RECHECK"])
    return job_outcome(job, (partial(released, [fleet.pk]),),
                       next_check_at=timezone.now() + timedelta(seconds=recheck))


def due_rechecks(due, limit: int) -> list[int]:
    """The waiting jobs among `due` (submitted jobs whose look is due) the sweep sends this time, at
    most `limit`, taking turns across projects: every project's longest-due job first, then every
    project's second, and so on. One query: a row number per project, in order of due time."""
    turns = due.filter(waiting_for__startswith=PREFIX).annotate(turn=Window(
        RowNumber(), partition_by=[F("run__project_id")], order_by=[F("next_check_at").asc(nulls_first=True),
                                                                   F("pk").asc()]))
    return list(turns.order_by("turn", "run__project_id").values_list("pk", flat=True)[:limit])


def over_cap(job: Job) -> str:
    """Why job 0 may not start waiting ("" when it may): its project has MUSTER_MAX_WAITING_RUNS_PER_PROJECT
    runs waiting already (a run already waiting keeps its place). The submit refuses a run that may
    wait past the cap (runs/limits.py); this holds it for runs submitted before any waited."""
    cap = int(settings.MUSTER["MAX_WAITING_RUNS_PER_PROJECT"])
    if cap <= 0 or job.waiting_for.startswith(PREFIX):
        return ""
    if run_limits.waiting_count(job.run.project_id, cap) < cap:
        return ""
    return (f"project {job.run.project.name} has {cap} runs waiting for a free host already, the most this server "
            "allows (MUSTER_MAX_WAITING_RUNS_PER_PROJECT)")
