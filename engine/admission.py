"""admit_fleet: who gets the hosts a fleet got back, decided and placed by one claimed step per fleet.

A job's end (or a placement that did not happen) gives hosts back (engine/submitted/waiting.py
`hand_back`, `released`); after its commit, when any job waits for a host, the fleet's FleetQueue
row counts one more release (`wanted`) and this step is sent (with nobody waiting a look would
wake nobody). The step claims the fleet's row, reads how many of its hosts are idle and the runs
waiting for them in the queue's order (runs/queue.py: the highest priority, then the oldest;
runs/admission.py; on a shared fleet in fair-share order, runs/admission_order.py), and chooses
the first ones that the idle hosts can hold (BestEffortFIFO, as Kueue's default: a run too big for
what is idle now is passed over for one that fits, and keeps its place for the next look).

The tasks it chose it places itself: their jobs are claimed in one batch; the runs alike (one group,
this fleet the only one they may use) are placed together in one transaction (engine/submitted/
together.py), each other one as its own provisioning step would (engine/submitted/provision.py
`provision_jobs`: hosts taken under the fleet's lock, quota checked there), so a freed host's next job is placed by the step
the release sent, with no message per run in between (a run that may use several fleets goes to
whichever has room, as anywhere; when that was another fleet, this one's hosts are offered again).
A look whose claim skipped the row (a release was counting on it that moment, and sent no look
because this one was out) sends itself again. A service replica, or a run with a slice
to make (a backend call that may take minutes), is woken instead: its own step places it.

So the choice costs one look per burst of releases, not a scan of the queue per host: the first
release's look runs a moment later (ADMISSION_GATHER_SECONDS, engine/submitted/waiting.py
`released`), so the releases close behind it are its too; releases
that come while a look holds the row only raise `wanted` (no message: it would bounce), and the
look, once given back, is sent again when `wanted` passed what it started from. The jobs a look
woke are its `promised`: the next look within PROMISE_SECONDS neither wakes them again nor counts
their hosts as free, so a burst's second look wakes the next runs, not the same ones twice. A look
that woke runs, or chose one it could not place after all, looks again once the promise is over
(the hosts it left idle are offered to the next one; the one not placed is passed over until its
own recheck). A task it chose whose job its own step holds (a recheck, which may be taking those
hosts itself) keeps them only HELD_SECONDS, and the look comes again then. The sweep's recheck of each waiting job stays the backstop for a lost message or a
host added (engine/sweeps.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial

from django.conf import settings
from django.utils import timezone

from engine import claims, messages
from engine.submitted import provision
from engine.tuning import ADMISSION_HELD_SECONDS as HELD_SECONDS
from engine.tuning import ADMISSION_PROMISE_SECONDS as PROMISE_SECONDS
from engine.tuning import ADMISSION_READ_MARGIN as MARGIN
from engine.tuning import ADMISSION_RETRY_SECONDS as RETRY_SECONDS
from engine.tuning import GATHERED
from instances import fleet_queue
from instances.models import FleetQueue, FleetStatus
from muster import step_reads
from runs import admission, admission_order


def admit_fleet(fleet_id: int) -> None:
    """The task's body: the fleet's row made if it has none yet, then the claimed step."""
    if not fleet_queue.ensure(fleet_id):
        return  # no such fleet, or not active: nothing is placed on it
    # the starts of the runs it places go to advance_jobs a few at a time, not one message each
    with messages.gathered(GATHERED):
        looked = claims.claimed(FleetQueue, fleet_id, "admit_fleet", _admit)
    if looked is None and fleet_queue.unlooked(fleet_id):
        # nobody holds the row, yet the claim skipped it: a release was counting on it that moment
        # (the claim skips a locked row), and that release sent no look, since this one was out
        messages.admit_fleet(fleet_id, countdown=RETRY_SECONDS)


def _admit(held: claims.Held) -> claims.Outcome:
    row = FleetQueue.objects.select_related("fleet").get(pk=held.pk)
    start, fleet = row.wanted, row.fleet
    now = time.time()
    # kept while they count (engine.tuning: a promise, then passed over until the job's own recheck)
    keep = max(PROMISE_SECONDS, float(settings.MUSTER["WAITING_HOST_RECHECK"]))
    promised = {int(pk): Promise.of(value) for pk, value in (row.promised or {}).items()}
    promised = {pk: p for pk, p in promised.items() if p.kept(now, keep)}
    promised = {pk: promised[pk] for pk in admission.still_waiting(promised)}  # the placed ones are done
    picks: list[int] = []  # woken to their own step
    later: list[float] = []  # when to look again, if at all
    if fleet.status == FleetStatus.ACTIVE:
        with step_reads.kept():  # the fleets, a shared fleet's quotas and usage: read once for the look's choices
            picks, later = _choose_and_place(fleet, now, promised)
    then = [partial(messages.provision_job, pk) for pk in picks]
    then.append(partial(_look_again, fleet.pk, start, min(later, default=None)))
    return claims.Outcome(fields={"admitted": start, "admitted_at": timezone.now(),
                                  "promised": {str(pk): p.stored() for pk, p in promised.items()}}, then=tuple(then))


def _choose_and_place(fleet, now: float, promised: dict[int, Promise]) -> tuple[list[int], list[float]]:
    """The look's choice on an active fleet: the tasks chosen placed, `promised` brought up to date.
    Returns (the jobs to wake to their own step, when to look again)."""
    live = {pk: p.demand for pk, p in promised.items() if p.live(now)}
    idle = fleet_queue.idle_hosts(fleet)
    if idle <= sum(live.values()):
        return [], []
    # on a shared fleet across the projects sharing it, in fair-share order (runs/admission_order.py)
    heads = admission_order.heads_for(fleet, idle + len(promised) + MARGIN)
    picks = admission.choose(heads, idle, live, set(promised) - set(live),
                             partial(fleet_queue.fitting, fleet))
    demand = {h.pk: h.demand for h in heads}
    here = {h.pk for h in heads if h.here}
    # the tasks among them are placed by this step, in one claimed batch: no message
    placing = [pk for pk in picks if pk in here]
    placed, tried = provision.provision_jobs(placing, fleet) if placing else ({}, set())
    # one it held and did not place after all (a race, its quota) is passed over from now on
    promised.update((pk, Promise(now - PROMISE_SECONDS, demand[pk])) for pk in tried - set(placed))
    # one its own step held (a recheck) may be taking the hosts itself: they stay its for a
    # moment (HELD_SECONDS), not a whole promise, then the next look offers them again
    elsewhere = set(placing) - tried
    promised.update((pk, Promise(now, demand[pk], held=HELD_SECONDS)) for pk in elsewhere)
    picks = [pk for pk in picks if pk not in here]  # woken to their own step
    promised.update((pk, Promise(now, demand[pk])) for pk in picks)
    # a run placed on another of its fleets left this one's hosts idle: offered again at once
    away = any(f != fleet.pk for f in placed.values())
    later = [*([PROMISE_SECONDS] if picks or tried - set(placed) else []),
             *([HELD_SECONDS] if elsewhere else []), *([RETRY_SECONDS] if away else [])]
    return picks, later


@dataclass(frozen=True)
class Promise:
    """A job a look woke or chose, as the fleet's row keeps it: since when, how many hosts it counts
    as taking, and, for a job its own step held, how long those hosts stay its (`held`)."""

    when: float
    demand: int
    held: float | None = None

    @classmethod
    def of(cls, value) -> Promise:
        """As stored: [when, demand], [when, demand, held], or an early row's bare time."""
        if not isinstance(value, list):
            return cls(float(value), 1)
        return cls(float(value[0]), int(value[1]), float(value[2]) if len(value) > 2 else None)

    def stored(self) -> list:
        return [self.when, self.demand] if self.held is None else [self.when, self.demand, self.held]

    def live(self, now: float) -> bool:
        """Its hosts still count as taken: a woken job's for PROMISE_SECONDS, a held one's for `held`."""
        return now - self.when < (PROMISE_SECONDS if self.held is None else self.held)

    def kept(self, now: float, keep: float) -> bool:
        """Still on the row: while live, and a woken job that did not take its hosts is then passed
        over until `keep` (its own recheck); a held one is offered again as soon as `held` is over."""
        return now - self.when < (keep if self.held is None else self.held)


def _look_again(fleet_id: int, start: int, after: float | None) -> None:
    """Sent once the look's row is free: at once when releases came during the look (their own
    messages were not sent: the row was held), and `after` seconds when its promises run out (a
    woken run, or one held by its own step, that did not take its hosts leaves them to the next)."""
    if FleetQueue.objects.filter(pk=fleet_id, wanted__gt=start).exists():
        messages.admit_fleet(fleet_id)
    if after is not None:
        messages.admit_fleet(fleet_id, countdown=after)
