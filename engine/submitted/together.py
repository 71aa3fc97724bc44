"""The runs a fleet's admission look places together, in one transaction.

The look (engine/admission.py) chooses the waiting runs the idle hosts go to and places them in one
claimed batch (provision.py `provision_jobs`). Attempted one by one, each run costs about twenty
statements in three transactions: its fleet chosen (the idle hosts read), the run moved, the fleet
locked and the idle hosts read again to take them, the project's usage read again under the lock,
the jobs moved. Most runs of a deep queue are alike: one group (one job, or a gang whose job 0
takes a host for each of its nodes), one fleet they may use, hosts of it to take. Those are placed
here together: the fleet locked once, its usage (a shared fleet's) read once under the lock, the
idle hosts each shape of resources needs read once and locked, each run's quota asked in queue
order with the ones before it counted, then one UPDATE of the hosts per project, one of the runs,
one of all their jobs and one INSERT of every event (runs/transitions.py `place_runs`).

What is not alike goes on to the one-run attempt, in the same step: a run of several groups (its
groups may go to different fleets), a gang on a fleet whose hosts may not reach each other, one
that may use other fleets too (which one it gets is spanning.py's choice, its group's own
`fleets:` included), a service's replica, a run already on a fleet (a group placed again), one
whose quota refuses it or for which no idle host is left (its attempt words the wait). The look's
order holds whatever the path (`in_order`): the runs alike next to each other in it are placed
together when the first of them comes, after the runs before them, so a run of several groups of
a higher priority gets the last hosts before the runs alike behind it. Every run of a batch goes to its own attempt
when something moved under it (a run stopped meanwhile: the transaction is rolled back whole, and
nothing is half-placed) or when placing together failed (logged; the run at fault then backs off
its own row alone, as in any batch step).

Locks are taken in the order the one-run attempt takes them (the fleet's row FOR NO KEY UPDATE,
then the idle hosts SKIP LOCKED, then the rows it moves), so a look and a recheck racing for the
same hosts go one after the other, and neither gives a host twice.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from functools import partial
from itertools import islice

from celery.exceptions import SoftTimeLimitExceeded
from django.db import connection, transaction
from django.db.models import Exists, OuterRef

from engine import messages
from engine.nudges import is_service
from engine.submitted import waiting
from engine.tuning import TOGETHER_EXTRA_HOSTS as EXTRA
from instances import fitting, shares, spanning
from instances.fitting import candidates, page_for
from instances.models import Fleet, FleetShare, FleetStatus, Instance, InstanceStatus, Placement
from instances.transitions import take_idle
from muster.claimable import Lease
from muster.step_reads import fresher
from runs.choices import JobStatus, RunStatus
from runs.models import Job
from runs.transitions import place_runs

log = logging.getLogger(__name__)


def in_order(fleet: Fleet | None, jobs: list[Job], lease: Lease) -> Iterator[tuple[Job, Instance | None]]:
    """Each of `jobs` (the look's, in its order; held by `lease`) with its host when it was placed
    together, else None (the caller attempts it alone). Runs alike next to each other in the order
    are placed together, when the caller reaches the first of them: a run not alike before them is
    attempted first, so the look's order (priority, fair share) decides who gets the last hosts
    whatever the path. An error placing together is logged and leaves those runs to their own
    attempts (the transaction rolled back), where the run at fault backs off its own row alone."""
    same = _safely(partial(_alike, fleet, jobs), {}) if fleet is not None else {}
    streak: list[tuple[Job, list[Job]]] = []
    for job in [*jobs, None]:
        if job is not None and job.pk in same:
            streak.append((job, same[job.pk]))
            continue
        if streak:
            placed = _safely(partial(place_together, fleet, streak, lease), None)
            hosts = _placed(fleet, placed) if placed else {}
            yield from ((j, hosts.get(j.pk)) for j, _ in streak)
            streak = []
        if job is not None:
            yield job, None


def _safely(body, otherwise):
    try:
        return body()
    except SoftTimeLimitExceeded:
        raise  # the task's limit ends the whole step (engine/claims.py Held.row)
    except Exception:
        log.exception("placing runs together failed; each is attempted alone")
        return otherwise


def place_together(fleet: Fleet, runs: list[tuple[Job, list[Job]]], lease: Lease) -> Placed | None:
    """Place runs alike (above) on `fleet`'s idle hosts together, in one transaction: `runs` is
    (job 0, the rest of its group) each, job 0s the look chose, in its order, held by `lease`.
    Returns, once committed, the runs placed and the move of the caller's copies (`_placed` makes
    it); None when nothing was (the rest are the one-run attempt's)."""
    if not runs or not fitting.is_static(fleet):
        return None
    with transaction.atomic():
        shared = Fleet.objects.select_for_update(no_key=True).filter(pk=fleet.pk, status=FleetStatus.ACTIVE).annotate(
            has=Exists(FleetShare.objects.filter(fleet=OuterRef("pk")))).values_list("has", flat=True).first()
        if shared is None:
            return None  # the fleet is gone or going: each run's own attempt says what it waits for
        picks = _picks(fleet, runs, shared)
        moved = picks and all(take_idle(hosts, project) for project, hosts in _by_project(picks).items()) \
            and place_runs(fleet, picks, lease)
        if not moved:
            transaction.set_rollback(True)  # none to place, or something moved under the step: each run alone
            return None
    return picks, moved


def _placed(fleet: Fleet, placed: Placed) -> dict[int, Instance]:
    """After the commit (an error in here is the step's, not a reason to attempt the runs again):
    the caller's copies moved, the step's kept usage counting the hosts for its next choices, the
    members' starts sent with the step's others (engine/messages.py `gathered`; job 0's goes with
    its give-back). Returns {job 0's pk: its host}."""
    picks, move_copies = placed
    move_copies()
    for project, hosts in _by_project(picks).items():
        shares.took(fleet.pk, project, hosts)
    for _, members, _ in picks:
        for member in members:
            messages.advance_job(member.pk)
    return {job.pk: hosts[0] for job, _, hosts in picks}


def _alike(fleet: Fleet, jobs: list[Job]) -> dict[int, list[Job]]:
    """Those of `jobs` this module places, each with the rest of its run: job 0 of a waiting task run
    of one group whose jobs all wait for a host, on no fleet yet, that may go to `fleet` and no
    other (neither by the run's `fleets:` nor by its group's), and for several nodes a fleet whose
    hosts reach each other (`placement: cluster`, as fitting.first_fitting_fleet asks)."""
    if not fitting.is_static(fleet):
        return {}
    firsts = [j for j in jobs if j.job_num == 0 and j.node_group_rank == 0 and j.instance_id is None
              and j.waiting_for.startswith(waiting.PREFIX) and j.run.status == RunStatus.SUBMITTED
              and not j.run.stop_requested and j.run.fleet_id is None and not is_service(j.run)]
    if not firsts:
        return {}
    siblings: dict[int, list[Job]] = {}
    for sibling in Job.objects.filter(run_id__in={j.run_id for j in firsts}, superseded=False).only(
            "id", "run_id", "job_num", "node_group_index", "status", "instance_id").order_by("job_num"):
        siblings.setdefault(sibling.run_id, []).append(sibling)
    alike = {}
    for job in firsts:
        rest = [s for s in siblings.get(job.run_id, []) if s.pk != job.pk]
        if any(s.node_group_index != 0 or s.status != JobStatus.SUBMITTED or s.instance_id is not None for s in rest):
            continue
        if rest and fleet.placement != Placement.CLUSTER:
            continue
        if _only(fleet, job.run):
            alike[job.pk] = rest
    return alike


def _only(fleet: Fleet, run) -> bool:
    """Whether `fleet` is the one fleet the run's one group may go to (spanning.py's choice)."""
    fleets = fitting.candidate_fleets(run, fitting.usable_fleets(run))
    if [f.pk for f in fleets] != [fleet.pk]:
        return False
    own = spanning.group_fleet_names(run.configuration)
    return not own or not own[0] or fitting.written_name(fleets[0]) in own[0]


Pick = tuple[Job, list[Job], list[Instance]]  # job 0, the rest of its group, their hosts (job 0's first)
Placed = tuple[list[Pick], Callable[[], None]]  # the runs placed, the move of the caller's copies


def _picks(fleet: Fleet, runs: list[tuple[Job, list[Job]]], shared: bool) -> list[Pick]:
    """Hosts for each run that gets them all, in the runs' order, under the fleet's lock: idle,
    fitting its resources, locked here (hosts another step is taking are skipped), and within its
    project's quota with the runs before it counted (a shared fleet's: instances/shares.py). A run
    the hosts read so far cannot hold has more read (as take_instances does), so a run is passed
    over only when the fleet has no more idle hosts for it, as when it is attempted alone."""
    wanted: dict[str, int] = {}
    shapes: dict[str, dict] = {}
    for job, rest in runs:
        key = json.dumps(job.spec["resources"], sort_keys=True)
        wanted[key], shapes[key] = wanted.get(key, 0) + 1 + len(rest), job.spec["resources"]
    pools = {key: _Pool(candidates(fleet, shapes[key], page_for(n + EXTRA)), n + EXTRA) for key, n in wanted.items()}
    quotas = shares.shares_of([fleet.pk]).get(fleet.pk) if shared else None
    usage = shares.fresh_usage_of(fleet.pk) if quotas else {}
    if quotas:
        fresher(("usage", fleet.pk), dict(usage))  # exact as of the lock; `took` adds the placements
    used: set[int] = set()
    picks = []
    for job, rest in runs:
        hosts = pools[json.dumps(job.spec["resources"], sort_keys=True)].free(1 + len(rest), used)
        if len(hosts) < 1 + len(rest):
            continue  # the fleet has no more idle hosts for its whole group: its own attempt words the wait
        project = job.run.project_id
        demand = {"hosts": len(hosts), "gpus": sum(i.gpu_count for i in hosts)}
        if quotas and shares.refusal(project, quotas, usage, shares.totals_of(fleet.pk), demand, fleet.name):
            continue  # past its quota (and what it may borrow): its own attempt words the wait
        if quotas:
            mine = usage.get(project, {})
            usage[project] = {r: mine.get(r, 0) + demand[r] for r in shares.RESOURCES}
        used.update(i.pk for i in hosts)
        picks.append((job, rest, hosts))
    return picks


class _Pool:
    """One shape of resources' idle hosts of the fleet, in candidate order, read a page at a time and
    locked as they are read (SKIP LOCKED: a host another step is taking is left to it)."""

    def __init__(self, found: Iterator[Instance], first: int) -> None:
        self.found, self.read = found, []
        self._more(first)

    def free(self, n: int, used: set[int]) -> list[Instance]:
        """`n` hosts no run of the batch took yet, more read while short; fewer when there are no more."""
        while True:
            free = [i for i in self.read if i.pk not in used][:n]
            if len(free) == n or not self._more(n - len(free) + EXTRA):
                return free

    def _more(self, count: int) -> bool:
        chunk = list(islice(self.found, count))
        if chunk and connection.features.has_select_for_update_skip_locked:  # SQLite: the IMMEDIATE transaction
            locked = set(Instance.objects.filter(pk__in=[i.pk for i in chunk], status=InstanceStatus.IDLE)
                         .select_for_update(skip_locked=True).values_list("pk", flat=True))
            self.read += [i for i in chunk if i.pk in locked]
        else:
            self.read += chunk
        return bool(chunk)


def _by_project(picks: list[Pick]) -> dict[int, list[Instance]]:
    out: dict[int, list[Instance]] = {}
    for job, _, hosts in picks:
        out.setdefault(job.run.project_id, []).extend(hosts)
    return out
