"""The claim protocol every task and sweep uses.

A worker owns a row while `lease_until` is in the future and `lease_token` is its token. Claiming
is one conditional UPDATE that must touch exactly one row (portable to SQLite, where it runs in an
IMMEDIATE transaction); on PostgreSQL its row comes from a `SELECT ... FOR UPDATE SKIP LOCKED`
subquery of the same statement, so concurrent workers skip each other instead of queueing.
A worker that dies simply lets its lease expire, and the next sweep claims the row again.

Leases are short (LEASE_SECONDS, 15 s by default) so that a killed worker's rows come free soon,
and kept alive while their holder works: every claim is registered with this process's renewer,
a thread that pushes `lease_until` forward every third of a lease for the rows still held (on its
own connection, only while the token matches), until they are released. A worker killed with -9
takes its renewer with it, so its rows come free one lease later however long a step may take.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from datetime import timedelta

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import connection, models, transaction
from django.db.models import Case, F, Q, Value, When
from django.utils import timezone

from engine import locked_claims
from engine.outcome import Outcome, record_events
from muster.claimable import Lease, claim_conflict, lease_guard, leased, released, unleased

log = logging.getLogger(__name__)


def lease_seconds() -> float:
    return float(settings.MUSTER["LEASE_SECONDS"])


class _Renewer:
    """The rows this process holds, and the thread that keeps their leases alive."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.held: dict[tuple[type[models.Model], str], set] = {}
        self.pid = 0

    def hold(self, model, token: str, pks) -> None:
        with self.lock:
            self.held.setdefault((model, token), set()).update(pks)
            if self.pid != os.getpid():  # first claim in this process (or a fork's child)
                self.pid = os.getpid()
                threading.Thread(target=self._run, name="lease-renewer", daemon=True).start()

    def drop(self, model, token: str, pks=None) -> None:
        with self.lock:
            rows = self.held.get((model, token))
            if rows is None:
                return
            rows.difference_update(pks if pks is not None else set(rows))
            if not rows:
                del self.held[(model, token)]

    def _run(self) -> None:
        from django.db import connection as own

        while True:
            every = lease_seconds() / 3
            time.sleep(every)
            with self.lock:
                held = [(m, t, list(pks)) for (m, t), pks in self.held.items()]
            for model, token, pks in held:
                try:
                    rows = leased(model.objects.filter(pk__in=pks), token)
                    if rows.update(lease_until=timezone.now() + timedelta(seconds=lease_seconds())) < len(pks):
                        # rows released by other means, taken over or deleted are no longer ours
                        self.drop(model, token, set(pks) - set(rows.values_list("pk", flat=True)))
                except Exception:  # a broken connection must not end the renewals: try again next time
                    logging.getLogger(__name__).exception("renewing leases of %s failed", model.__name__)
            if held:
                own.close()  # hold no connection between rounds: most rounds have nothing to renew

    def clear(self) -> None:
        with self.lock:
            self.held.clear()

    def holding(self, model, token: str) -> set:
        with self.lock:
            return set(self.held.get((model, token), ()))


_renewer = _Renewer()


def claim(model: type[models.Model], pk, seconds: float | None = None, **conditions) -> str | None:
    """Claim row `pk` if it matches `conditions` and nobody holds it; return the token or None."""
    now = timezone.now()
    token = uuid.uuid4().hex
    until = now + timedelta(seconds=seconds if seconds is not None else lease_seconds())
    if connection.features.has_select_for_update_skip_locked:
        touched, conflict = locked_claims.take_one(model, pk, now, until, token, conditions)
    else:
        with transaction.atomic():  # SQLite: an IMMEDIATE transaction excludes every other writer
            touched = model.objects.filter(unleased(now), pk=pk, **conditions).update(
                lease_until=until, lease_token=token)
        conflict = touched != 1 and _held(model, pk, now, conditions)
    if touched != 1:
        if conflict:
            claim_conflict.send(sender=model)
        return None
    _renewer.hold(model, token, [pk])
    return token


def _held(model, pk, now, conditions) -> bool:
    """For /metrics: the row is there and in the state asked for, but another holder has it. A row
    that moved on (the usual duplicate nudge) is not a conflict. One query, on the failure path only."""
    return model.objects.filter(pk=pk, **conditions).exclude(unleased(now)).exists()


def forget_all() -> None:
    """Stop renewing every lease this process holds (a test that starts over with a new database)."""
    _renewer.clear()


def claim_batch(queryset, limit: int, seconds: float | None = None, renew: bool = True) -> tuple[str, list]:
    """Claim up to `limit` unleased rows of `queryset` at once; returns (token, pks).

    `renew=False` for a lease that is meant to run out (it spaces the SSH health checks).
    """
    now = timezone.now()
    token = uuid.uuid4().hex
    until = now + timedelta(seconds=seconds if seconds is not None else lease_seconds())
    qs = queryset.filter(unleased(now)).order_by("pk")
    if connection.features.has_select_for_update_skip_locked:
        pks = sorted(locked_claims.take(qs, limit, until, token))
    else:
        with transaction.atomic():
            pks = list(qs.values_list("pk", flat=True)[:limit])
            if pks:
                # SQLite's IMMEDIATE transaction excludes every other writer, so the update takes them all
                queryset.model.objects.filter(pk__in=pks).update(lease_until=until, lease_token=token)
    held = pks
    if held and renew:
        _renewer.hold(queryset.model, token, held)
    return token, held


def backoff_seconds() -> float:
    """How long a row whose step failed waits before anyone may claim it again (one lease)."""
    return lease_seconds()



# ---- the step: process -> outcome -> guarded apply ----------------------------------------------


class Held:
    """The rows one step holds while its body runs (claimed and claimed_batch hand it to the body)."""

    def __init__(self, model: type[models.Model], step: str, token: str, pks: list) -> None:
        self.model, self.step, self.token, self.pks = model, step, token, list(pks)
        self.failed: set = set()  # rows backed off after an exception
        self.applied: set = set()  # rows given back as their outcome said (their follow-ups were sent)
        self.given: set = set()  # rows the body gave back itself (give_back_now), not the batch's give-back
        self.outcome: Outcome | None = None  # what a one-row body returned

    @property
    def pk(self):
        return self.pks[0]

    @property
    def lease(self) -> Lease:
        """What a move of a held row inside the body takes (`lease=held.lease`): guarded by the token."""
        return Lease(self.token)

    def rows(self, queryset):
        """The rows of `queryset` among the held ones that this step still holds."""
        return leased(queryset.filter(pk__in=self.pks), self.token)

    def back_off(self, pks) -> None:
        """Give rows back so that they are due again only after a backoff: the lease runs on
        with nobody's token, so no claim takes them (nor renews them) until it is over."""
        pks = set(pks)
        self.failed |= pks
        # renewals stop first: should the UPDATE fail too (the database is gone), the lease
        # simply runs out one lease from now, which is the backoff as well
        _renewer.drop(self.model, self.token, pks)
        until = timezone.now() + timedelta(seconds=backoff_seconds())
        self.model.objects.filter(pk__in=pks, **lease_guard(self.token)).update(**released(until))

    def give_back_now(self, pk, outcome: Outcome) -> bool:
        """Apply one row's outcome at once, not with the batch's (`give_back`): for a batch whose
        rows each wait on a host in turn, so a row done early is not held until the last one is."""
        self.given.add(pk)
        if give_back(self.model, pk, self.token, outcome, self.step):
            self.applied.add(pk)
            return True
        return False

    @contextmanager
    def row(self, pk) -> Iterator[None]:
        """One row of a batch: its exception is logged and backs off that row only. The task's soft
        time limit is not one row's: it ends the batch (the rows not given back yet are backed off),
        so the hard limit never kills a worker half-way through a give-back."""
        try:
            yield
        except SoftTimeLimitExceeded:
            raise
        except Exception:
            log.exception("step %s failed on %s %s; due again in %.0fs", self.step, self.model.__name__, pk,
                          backoff_seconds())
            self.back_off([pk])


def give_back(model: type[models.Model], pk, token: str, outcome: Outcome, step: str = "") -> bool:
    """Apply one row's outcome: True when the row was given back as the body left it.

    One UPDATE in the common case (pk + token + expected status; the lease cleared, the fields
    written); then the follow-ups. A row in another status is given back as it is (a second
    UPDATE guarded by the token) and handed over if its new status asks for it. A token that
    touches nothing is stale (the lease ran out and somebody else took the row): logged, dropped.
    """
    try:
        with transaction.atomic() if outcome.events else nullcontext():
            applied = _apply(model, pk, token, outcome)
            if applied:
                record_events(outcome.events)
        if applied:
            for send in outcome.then:
                send()
            return True
        with transaction.atomic() if outcome.events else nullcontext():
            # what the body learned still holds of a row that moved on: written, with its events
            kept = model.objects.filter(pk=pk, **lease_guard(token), **outcome.where).update(**outcome.written())
            if kept:
                record_events(outcome.events)
        if not kept and outcome.where and model.objects.filter(pk=pk, **lease_guard(token)).update(
                **outcome.written(fields=False)):
            log.info("step %s: %s %s changed under it (%s): what it learned is dropped", step, model.__name__,
                     pk, ", ".join(outcome.where))
            return False
        if not kept:
            log.warning("step %s: %s %s was no longer held (stale lease): its outcome is dropped", step,
                        model.__name__, pk)
            return False
        _hand_over(model, [pk], outcome.hand_over)
        return False
    finally:
        _renewer.drop(model, token, [pk])


def _apply(model, pk, token: str, outcome: Outcome) -> bool:
    """The give-back's one guarded write: the move, or the UPDATE of the fields that clears the lease."""
    if outcome.move is not None:
        return outcome.move(lease=Lease(token, ends=True))
    touched = locked_claims.give_back_one(model, pk, token, tuple(outcome.expect), outcome.written(), outcome.where)
    if touched is None:
        touched = model.objects.filter(pk=pk, **lease_guard(token), **outcome.guard()).update(**outcome.written())
    return touched == 1


def _hand_over(model, pks, hand_over: Mapping) -> None:
    if not hand_over:
        return
    for pk, status in model.objects.filter(pk__in=pks).values_list("pk", "status"):
        send = hand_over.get(status)
        if send is not None:
            send(pk)


def give_back_batch(held: Held, outcomes: Mapping) -> None:
    """Apply a batch's outcomes in one UPDATE (each row guarded by its own expected status, each
    field a CASE where rows differ); rows of the batch without an outcome go back as they are.
    Only when that UPDATE touches fewer rows than it was given are the rows still held looked up:
    those somebody moved are given back as they are and handed over, the others were stale."""
    model, token = held.model, held.token
    outcomes = {pk: outcomes.get(pk) or Outcome() for pk in held.pks if pk not in held.failed | held.given}
    # a move, a backoff or a field guard is given back on its own (the bulk UPDATE clears every lease)
    moves = {pk: o for pk, o in outcomes.items() if o.move is not None or o.retry_in or o.where}
    plain = {pk: o for pk, o in outcomes.items() if pk not in moves}
    for pk, outcome in moves.items():
        if give_back(model, pk, token, outcome, held.step):
            held.applied.add(pk)
    if not plain:
        return
    try:
        guard = Q()
        by_expect: dict[tuple, list] = {}
        for pk, outcome in plain.items():
            by_expect.setdefault(tuple(outcome.expect), []).append(pk)
        for expect, pks in by_expect.items():
            guard |= Q(pk__in=pks, status__in=expect) if expect else Q(pk__in=pks)
        events = any(o.events for o in plain.values())
        moved: set = set()
        with transaction.atomic() if events else nullcontext():
            touched = model.objects.filter(guard, **lease_guard(token)).update(
                **released(), **_fields_by_row(model, plain))
            applied = set(plain)
            if touched != len(plain):
                rows = dict(model.objects.filter(pk__in=plain).exclude(lease_token="").values_list(
                    "pk", "lease_token"))
                moved = {pk for pk, t in rows.items() if t == token}
                stale = set(rows) - moved
                if stale:
                    log.warning("step %s: %s %s no longer held (stale lease): their outcomes are dropped",
                                held.step, model.__name__, sorted(stale))
                applied -= moved | stale
            if events:
                record_events([e for pk in sorted(applied) for e in plain[pk].events])
        if moved:
            model.objects.filter(pk__in=moved, **lease_guard(token)).update(**released())
            for pk in moved:
                _hand_over(model, [pk], plain[pk].hand_over)
        held.applied |= applied
        for pk in sorted(applied):
            for send in plain[pk].then:
                send()
    finally:
        _renewer.drop(model, token, set(plain))


def _fields_by_row(model, outcomes: Mapping) -> dict:
    """One value per field for the bulk UPDATE: the value when every row has the same, else a CASE
    on pk (rows without the field keep theirs), typed by the field (a JSON list is no SQL literal)."""
    names = {name for o in outcomes.values() for name in o.fields}
    values = {}
    for name in names:
        given = {pk: o.fields[name] for pk, o in outcomes.items() if name in o.fields}
        distinct = set(map(repr, given.values()))
        if len(given) == len(outcomes) and len(distinct) == 1:
            values[name] = next(iter(given.values()))
        else:
            field = model._meta.get_field(name)
            values[name] = Case(*(When(pk=pk, then=Value(v, output_field=field)) for pk, v in given.items()),
                                default=F(name), output_field=field)
    return values


def _failed(held: Held) -> None:
    log.exception("step %s failed on %s %s; due again in %.0fs", held.step, held.model.__name__,
                  held.pks if len(held.pks) > 1 else held.pk, backoff_seconds())
    held.failed |= set(held.pks) - held.applied - held.given
    held.back_off(_renewer.holding(held.model, held.token))  # rows the give-back had not reached yet


def claimed(model: type[models.Model], pk, step: str, body: Callable[[Held], Outcome | None],
            **conditions) -> Held | None:
    """The one way to write a step: claim row `pk` (None when it is not claimable: somebody holds it,
    or it moved on), run `body(held)` with the lease renewed, and apply the Outcome it returns
    (None: give the row back as it is, nothing sent) with `give_back`.

    An exception in the body is logged with the row and the step and is not raised further: the
    row goes back with a backoff (`Held.back_off`, `held.failed`), so the sweep sends its step
    again once that is over; nothing is applied and no follow-up is sent.
    """
    token = claim(model, pk, **conditions)
    if token is None:
        return None
    held = Held(model, step, token, [pk])
    try:
        held.outcome = body(held) or Outcome()
        if give_back(model, pk, token, held.outcome, step):
            held.applied.add(pk)
    except Exception:
        _failed(held)
    return held


def claimed_batch(queryset, limit: int, step: str, body: Callable[[Held], Mapping]) -> Held:
    """`claimed` for up to `limit` rows at once: `body(held)` returns {pk: Outcome} (guarding each
    row's work with `held.row`, which backs off that row alone), applied with `give_back_batch`."""
    token, pks = claim_batch(queryset, limit)
    held = Held(queryset.model, step, token, pks)
    if not pks:
        return held
    try:
        give_back_batch(held, body(held) or {})
    except Exception:
        _failed(held)
    return held
