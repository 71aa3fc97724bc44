"""Running one step's body in the test process, without a worker: what it sent, and when.

`Sent` stands in for the Celery registry engine/messages.py sends through: every message a step
sends is recorded with whether its row was still leased at that moment (a follow-up must leave
only once the row is free, or it bounces off the step's own claim). `around_body` wraps a step's
body so a test can act while the step holds its row: take the lease away (a stale token) or move
the row as another process would (contention).
"""

from __future__ import annotations

from django.utils import timezone

from instances.models import InstanceGroup
from runs.models import Job, Run

ROWS = {"provision_job": Job, "recheck_jobs": Job, "advance_job": Job, "advance_jobs": Job, "finish_job": Job, "finish_jobs": Job,
        "process_run": Run, "process_runs": Run,
        "terminate_group": InstanceGroup, "poll_pod": InstanceGroup}


class Sent:
    def __init__(self) -> None:
        self.messages: list[tuple] = []

    def __getattr__(self, name: str):
        sent = self

        class Task:
            def delay(self, *args):
                sent.record(name, args, 0)

            def apply_async(self, args=(), countdown=0, **options):
                sent.record(name, tuple(args), countdown)

        return Task()

    def record(self, name: str, args: tuple, countdown: float) -> None:
        model = ROWS.get(name)
        pks = args[0] if isinstance(args[0], list) else [args[0]]  # a batch's message names its rows
        leased = bool(model and model.objects.filter(pk__in=pks).exclude(lease_token="").exists())
        self.messages.append((name, args[0], countdown, leased))

    def names(self) -> list[tuple]:
        return [(name, pk) for name, pk, _, _ in self.messages]

    def clear(self) -> None:
        self.messages.clear()


def around_body(monkeypatch, module, name: str, after):
    """Run `after(held)` once the step's body `module.name` returned, before its outcome is applied."""
    original = getattr(module, name)

    def wrapped(*args, **kwargs):
        outcome = original(*args, **kwargs)
        after(args[-1])  # the body's last positional argument is its Held
        return outcome

    monkeypatch.setattr(module, name, wrapped)


def steal(model):
    """What a lost lease amounts to: the row ran out of its lease and another holder took it."""
    def act(held):
        model.objects.filter(pk__in=held.pks).update(lease_token="someone-else", lease_until=timezone.now())
    return act


def stop_job(held) -> None:
    """A user's stop while the step holds the job: the job turns terminating under it."""
    Job.objects.filter(pk__in=held.pks).update(status="terminating", termination_reason="terminated_by_user")
