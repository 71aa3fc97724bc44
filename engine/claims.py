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
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

from django.conf import settings
from django.db import connection, models, transaction
from django.db.models import Q
from django.utils import timezone

from muster.claimable import claim_conflict

log = logging.getLogger(__name__)


def lease_seconds() -> float:
    return float(settings.MUSTER["LEASE_SECONDS"])


def unleased(now=None) -> Q:
    now = now or timezone.now()
    return Q(lease_until__isnull=True) | Q(lease_until__lt=now)


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
                    rows = model.objects.filter(pk__in=pks, lease_token=token)
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
    qs = model.objects.filter(unleased(now), pk=pk, **conditions)
    with transaction.atomic():
        if connection.features.has_select_for_update_skip_locked:
            # one statement: UPDATE ... WHERE pk IN (SELECT ... FOR UPDATE SKIP LOCKED)
            qs = model.objects.filter(pk__in=qs.select_for_update(skip_locked=True).values("pk"))
        touched = qs.update(lease_until=until, lease_token=token)
    if touched != 1:
        _count_conflict(model, pk, now, conditions)
        return None
    _renewer.hold(model, token, [pk])
    return token


def _count_conflict(model, pk, now, conditions) -> None:
    """For /metrics: the row is there and in the state asked for, but another holder has it. A row
    that moved on (the usual duplicate nudge) is not a conflict. One query, on the failure path only."""
    if model.objects.filter(pk=pk, **conditions).exclude(unleased(now)).exists():
        claim_conflict.send(sender=model)


def release(model: type[models.Model], pk, token: str, where: dict | None = None, **updates) -> bool:
    """Give the row back, applying `updates` only if we still hold it (and it matches `where`)."""
    touched = model.objects.filter(pk=pk, lease_token=token, **(where or {})).update(
        lease_until=None, lease_token="", **updates)
    if touched == 1 or not where:  # with `where` unmet the caller still holds the row and releases it next
        _renewer.drop(model, token, [pk])
    return touched == 1


def forget(model: type[models.Model], token: str, pks=None) -> None:
    """Stop renewing rows the caller gave back by other means (one UPDATE for a whole batch)."""
    _renewer.drop(model, token, pks)


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
    with transaction.atomic():
        qs = queryset.filter(unleased(now)).order_by("pk")
        if connection.features.has_select_for_update_skip_locked:
            qs = qs.select_for_update(skip_locked=True)
        pks = list(qs.values_list("pk", flat=True)[:limit])
        if pks:
            # the rows are locked by this transaction (SKIP LOCKED on PostgreSQL; SQLite's IMMEDIATE
            # transaction excludes every other writer), so the update takes every one of them
            queryset.model.objects.filter(pk__in=pks).update(lease_until=until, lease_token=token)
    held = pks
    if held and renew:
        _renewer.hold(queryset.model, token, held)
    return token, held


def backoff_seconds() -> float:
    """How long a row whose step failed waits before anyone may claim it again (one lease)."""
    return lease_seconds()


class Held:
    """The rows one step holds: given back by the step as it goes, or by `claimed` when it ends."""

    def __init__(self, model: type[models.Model], step: str, token: str, pks: list) -> None:
        self.model, self.step, self.token, self.pks = model, step, token, list(pks)
        self.failed: set = set()  # rows backed off after an exception

    @property
    def pk(self):
        return self.pks[0]

    def back_off(self, pks) -> None:
        """Give rows back so that they are due again only after a backoff: the lease runs on
        with nobody's token, so no claim takes them (nor renews them) until it is over."""
        pks = set(pks)
        self.failed |= pks
        # renewals stop first: should the UPDATE fail too (the database is gone), the lease
        # simply runs out one lease from now, which is the backoff as well
        _renewer.drop(self.model, self.token, pks)
        until = timezone.now() + timedelta(seconds=backoff_seconds())
        self.model.objects.filter(pk__in=pks, lease_token=self.token).update(lease_until=until, lease_token="")

    @contextmanager
    def row(self, pk) -> Iterator[None]:
        """One row of a batch: its exception is logged and backs off that row only."""
        try:
            yield
        except Exception:
            log.exception("step %s failed on %s %s; due again in %.0fs", self.step, self.model.__name__, pk,
                          backoff_seconds())
            self.back_off([pk])

    def close(self) -> None:
        # Rows the step neither gave back nor backed off go back as they are (one UPDATE, and
        # none at all in the common case: the step's own release already dropped them).
        left = _renewer.holding(self.model, self.token)
        if left:
            _renewer.drop(self.model, self.token, left)  # first, as in back_off
            self.model.objects.filter(pk__in=left, lease_token=self.token).update(lease_until=None, lease_token="")


@contextmanager
def _owning(held: Held) -> Iterator[Held]:
    try:
        yield held
    except Exception:
        log.exception("step %s failed on %s %s; due again in %.0fs", held.step, held.model.__name__,
                      held.pks if len(held.pks) > 1 else held.pk, backoff_seconds())
        held.back_off(_renewer.holding(held.model, held.token))
    finally:
        held.close()


@contextmanager
def claimed(model: type[models.Model], pk, step: str, **conditions) -> Iterator[Held | None]:
    """The one claimed step: claim row `pk` (None when it is not claimable), renew its lease while
    the block runs, and give it back when the block ends, whatever happens in it.

    An exception is logged with the row and the step and is not raised further: the row goes back
    with a backoff (`Held.back_off`), so the sweep sends its step again once that is over. What the
    step sends next it sends after the block, once the row is given back (a message sent while the
    row is held would bounce off the claim).
    """
    token = claim(model, pk, **conditions)
    if token is None:
        yield None
        return
    with _owning(Held(model, step, token, [pk])) as held:
        yield held


@contextmanager
def claimed_batch(queryset, limit: int, step: str) -> Iterator[Held]:
    """`claimed` for up to `limit` rows at once; `Held.row` guards each row's work on its own."""
    token, pks = claim_batch(queryset, limit)
    with _owning(Held(queryset.model, step, token, pks)) as held:
        yield held
