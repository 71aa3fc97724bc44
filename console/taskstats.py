"""Task outcomes and durations, and sweep recoveries, counted in the worker processes.

Celery's signals fire in the process that runs the task. Each process adds to its own totals and
writes them to the database (console.models.Counter) at most every FLUSH_SECONDS and when it
exits, so a busy worker costs one small write per few seconds, not one per task; /metrics reads
the sums, which are right however many worker processes and machines there are.
"""

from __future__ import annotations

import logging
import threading
import time

from celery.signals import task_failure, task_postrun, task_prerun, worker_process_shutdown, worker_shutdown
from django.db import transaction
from django.db.models import F
from django.dispatch import receiver

from muster.claimable import claim_conflict

log = logging.getLogger(__name__)
FLUSH_SECONDS = 5.0
# the sweep's return value names what it sent again (engine/sweeps.py): these are recoveries;
# `runs_routine` (a run derived after job moves that nudge nobody by design), `retries` (a retry
# whose backoff is over), `waiting_rechecks` (a run waiting for a host of a full fleet, looked at
# again) and `watch` (running jobs overdue because beat's watch ticks expired in a backlog, as
# they are meant to: late, not lost) are sends the sweep makes as its routine, counted apart
SWEEP_RECOVERY_KEYS = ("provision", "advance", "finish", "runs", "groups", "pods", "fleets", "fleet_deletions")
SWEEP_ROUTINE_KEYS = {"runs_routine": "derive", "retries": "retry", "waiting_rechecks": "recheck", "watch": "watch"}

_lock = threading.Lock()
_started: dict[str, float] = {}
_failed: set[str] = set()
_pending: dict[tuple[str, str, str], list] = {}
_last_flush = time.monotonic()


def add(name: str, label: str, outcome: str = "", count: int = 1, seconds: float = 0.0) -> None:
    with _lock:
        entry = _pending.setdefault((name, label, outcome), [0, 0.0])
        entry[0] += count
        entry[1] += seconds


def flush(force: bool = False) -> None:
    global _last_flush
    with _lock:
        if not _pending or (not force and time.monotonic() - _last_flush < FLUSH_SECONDS):
            return
        pending = dict(_pending)
        _pending.clear()
        _last_flush = time.monotonic()
    from console.models import Counter

    try:
        with transaction.atomic():
            for (name, label, outcome), (count, seconds) in sorted(pending.items()):
                touched = Counter.objects.filter(name=name, label=label, outcome=outcome).update(
                    count=F("count") + count, seconds=F("seconds") + seconds)
                if not touched:
                    Counter.objects.create(name=name, label=label, outcome=outcome, count=count, seconds=seconds)
    except Exception:  # noqa: BLE001 - metrics must never fail a task; the counts come back next time
        log.warning("task metrics not written; kept for the next flush", exc_info=True)
        with _lock:
            for key, (count, seconds) in pending.items():
                entry = _pending.setdefault(key, [0, 0.0])
                entry[0] += count
                entry[1] += seconds


@task_prerun.connect
def _prerun(task_id=None, **_) -> None:
    if task_id:
        _started[task_id] = time.monotonic()


@task_failure.connect
def _failure(task_id=None, **_) -> None:
    if task_id:
        _failed.add(task_id)


@task_postrun.connect
def _postrun(task_id=None, task=None, retval=None, state=None, **_) -> None:
    began = _started.pop(task_id, None)
    seconds = time.monotonic() - began if began is not None else 0.0
    outcome = "failure" if task_id in _failed else (state or "unknown").lower()
    _failed.discard(task_id)
    name = getattr(task, "name", "unknown")
    add("task", name, outcome, 1, seconds)
    if name == "engine.tasks.sweep" and isinstance(retval, dict):
        for key in SWEEP_RECOVERY_KEYS:
            if retval.get(key):
                add("sweep_recovery", key, "", int(retval[key]))
        for key, kind in SWEEP_ROUTINE_KEYS.items():
            if retval.get(key):
                add("sweep_routine", kind, "", int(retval[key]))
    flush()


@receiver(claim_conflict)
def _claim_conflict(sender=None, **_) -> None:
    add("claim_conflict", sender._meta.model_name)


@worker_process_shutdown.connect
@worker_shutdown.connect
def _shutdown(**_) -> None:
    flush(force=True)
