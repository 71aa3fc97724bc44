"""Reads one step keeps: inside `kept()`, a read asked again with the same key is answered from the
first time it was made in the step.

A provisioning step asks the same questions of the same rows several times: which fleets a run may
use, a shared fleet's quotas, usage and size (which fleet the run goes to, the fleets it would wait
for, what it waits for), and an admission look asks them again for every run it places. Those
answers only choose; the writes that give hosts re-read under their locks what must be exact
(instances/shares.py `within`, engine/submitted/placement.py). A stale answer tries a fleet that
then refuses, or waits a recheck longer. Outside `kept()` every read is made afresh.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TypeVar

T = TypeVar("T")

_kept: ContextVar[dict | None] = ContextVar("step_reads", default=None)


@contextmanager
def kept() -> Iterator[None]:
    """Reads made inside are kept until the block ends; nested, the outer step's are kept."""
    if _kept.get() is not None:
        yield
        return
    token = _kept.set({})
    try:
        yield
    finally:
        _kept.reset(token)


def once(key: tuple, read: Callable[[], T]) -> T:
    """`read()`, or what it gave the first time inside the same `kept()` block."""
    memo = _kept.get()
    if memo is None:
        return read()
    if key not in memo:
        memo[key] = read()
    return memo[key]


def update(key: tuple, change: Callable[[T], T]) -> None:
    """What a step's own write changed in a kept read: `change(old)` replaces it, when it was read
    inside the current `kept()` block (else nothing: the next read is made afresh anyway)."""
    memo = _kept.get()
    if memo is not None and key in memo:
        memo[key] = change(memo[key])


def fresher(key: tuple, value: object) -> None:
    """A read the step just made afresh (under a lock) of what it may keep: later asks inside the
    current `kept()` block get it instead of an older answer."""
    memo = _kept.get()
    if memo is not None:
        memo[key] = value
