"""Fault injection for the claimed steps' messages, shared by the tests that drop or double them
(tests/engine/test_task_faults.py, tests/engine/test_fleet_deletion_faults.py, the TPU, SSH
registration, attach revoke and router sync fault tests)."""

from __future__ import annotations

import threading

import pytest


class Faulty:
    """Wraps a task's apply_async (which `delay` calls too): 'drop' loses the first message for each
    row (a step's first argument is its row's pk, or a batch's list of them; the others, an actor, differ between the message
    of a request and the sweep's), 'twice' sends every message twice. `sent` counts the messages the code asked
    for, `dropped` and `doubled` the faults injected, so a test can show the fault was real."""

    def __init__(self, task, mode: str):
        assert mode in ("drop", "twice"), mode
        self.task, self.mode = task, mode
        self.original = task.apply_async
        self.seen: set = set()
        self.sent = self.dropped = self.doubled = 0
        self.lock = threading.Lock()

    def __call__(self, args=None, kwargs=None, **options):
        # a batch step's first argument is its rows' pks (a list)
        key = tuple(tuple(a) if isinstance(a, list) else a for a in tuple(args or ())[:1])
        with self.lock:
            self.sent += 1
            first = key not in self.seen
            self.seen.add(key)
            if self.mode == "drop" and first:
                self.dropped += 1
                return None
            if self.mode == "twice":
                self.doubled += 1
        if self.mode == "twice":
            self.original(args, kwargs, **options)
        return self.original(args, kwargs, **options)

    @property
    def injected(self) -> int:
        return self.dropped + self.doubled


def inject(monkeypatch, name: str, mode: str) -> Faulty:
    """Put a Faulty on the engine task `name` (the registered object engine/messages.py sends)."""
    from engine import tasks

    task = getattr(tasks, name)
    faulty = Faulty(task, mode)
    monkeypatch.setattr(task, "apply_async", faulty)
    return faulty


# A module that imports these two runs its celery_worker with two threads, so that a message
# delivered twice can be processed twice at once, as by two workers.
@pytest.fixture(scope="session")
def celery_worker_pool():
    return "threads"


@pytest.fixture(scope="session")
def celery_worker_parameters(celery_config):
    return {"queues": (celery_config["task_default_queue"],), "perform_ping_check": False,
            "shutdown_timeout": 20, "concurrency": 2}
