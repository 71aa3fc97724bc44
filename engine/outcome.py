"""What a claimed step's body leaves for engine/claims.py to apply: its Outcome, and the events it
carries (written in the give-back's transaction, with what the body learned).

What a body finds out about its row on the way, deep in the functions it calls, is `learn`ed on the
row's copy (fields, events, follow-ups) and taken into the Outcome it returns (`learned`): the
body never writes its own row.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta

from django.utils import timezone

from events.services import record_many
from muster.claimable import released


@dataclass
class Outcome:
    """What a step body leaves for `claimed` to apply once it returns; the step gives nothing back itself.

    `expect`: the statuses the body left the row in (usually one: `(job.status,)` after its moves).
    The give-back is guarded by them, so a row somebody else moved while it was held (a user stop)
    is found out in the same statement. Empty: any status.
    `fields`: what the body learned (`next_check_at`, `agent_seen_at`, ...), written by the same
    UPDATE that clears the lease.
    `events`: the events the body wants written with what it learned (`event(...)` entries), in the
    give-back's transaction: written when the fields are, never when the lease was lost.
    `move`: a status move through the row's transition function, called as `move(lease=...)` with the
    step's lease ending in it (muster.claimable.Lease): the function guards its UPDATE by pk + token +
    status and clears the lease in it (every transition function takes `lease=`), and returns whether
    it moved the row. Used when the step's last move is the give-back itself.
    `then`: the follow-ups (engine/messages.py calls, or a check that must see the row free), run
    once the row is given back as the body left it, each sent after commit.
    `hand_over`: status -> message(pk), for a row found in another status than `expect` (it turned
    terminating while held: the stop's own message bounced off our lease, so it is sent again).
    `retry_in`: seconds the row stays unclaimable once given back (its lease runs on with nobody's
    token, as `Held.back_off` does): a step whose work failed and must be tried again later
    (a cloud call refused) backs off instead of being sent again by the next sweep.
    `where`: field equalities the row must still hold for what the body learned to be written (one
    row's give-back only): for a row that a writer without the lease may change under the step (a
    rolling update raises a run's deployment_num under the scaler). A row that no longer matches is
    given back with only its lease released: the fields, events and follow-ups are dropped, as they
    were worked out from what is no longer so (the step looks again next time).
    """

    expect: tuple = ()
    fields: dict = field(default_factory=dict)
    move: Callable[..., bool] | None = None
    then: tuple[Callable[[], object], ...] = ()
    events: tuple[dict, ...] = ()
    hand_over: Mapping[str, Callable[[object], object]] = field(default_factory=dict)
    retry_in: float | None = None
    where: dict = field(default_factory=dict)

    def guard(self) -> dict:
        return {**({"status__in": self.expect} if self.expect else {}), **self.where}

    def written(self, fields: bool = True) -> dict:
        """The lease's release and the fields, as the give-back's UPDATE writes them."""
        until = timezone.now() + timedelta(seconds=self.retry_in) if self.retry_in else None
        return {**released(until), **(self.fields if fields else {})}


def event(project_id: int, subject: str, message: str, *, status: str = "", actor: str = "server", run_id=None,
          job_id=None, instance_id=None) -> dict:
    """One event for an Outcome's `events` (the arguments of events.services.record)."""
    return {"project_id": project_id, "subject": subject, "message": message, "status": status, "actor": actor,
            "run_id": run_id, "job_id": job_id, "instance_id": instance_id}


def record_events(events) -> None:
    by_writer: dict[tuple, list[dict]] = {}
    for entry in events:
        entry = dict(entry)
        by_writer.setdefault((entry.pop("project_id"), entry.pop("actor")), []).append(entry)
    for (project_id, actor), entries in by_writer.items():
        record_many(project_id, entries, actor=actor)


@dataclass
class Learned:
    fields: dict = field(default_factory=dict)
    events: list = field(default_factory=list)
    then: list = field(default_factory=list)


def learn(row, *, event: dict | None = None, then: Callable[[], object] | None = None, **fields) -> None:
    """Note what the step holding `row` found out: `fields` go on the copy now and into the row with
    the give-back, `event` (an `event(...)`) in its transaction, `then` once the row is free."""
    learned = row.__dict__.setdefault("_learned", Learned())
    for name, value in fields.items():
        setattr(row, name, value)
    learned.fields.update(fields)
    if event is not None:
        learned.events.append(event)
    if then is not None:
        learned.then.append(then)


def learned(row) -> Learned:
    """What was learned about `row` so far, taken off it (for the Outcome the body returns)."""
    return row.__dict__.pop("_learned", None) or Learned()


def with_learned(row, *, expect: tuple = (), then=(), hand_over: Mapping | None = None, where: dict | None = None,
                 **fields) -> Outcome:
    """The Outcome that gives `row` back with `fields` and what was learned about it (its follow-ups
    first, then `then`). A learned field is written as the copy holds it now: a move since (which
    writes the field too, and sets it on the copy) is not undone."""
    found = learned(row)
    return Outcome(expect=tuple(expect), fields={**{name: getattr(row, name) for name in found.fields}, **fields},
                   events=tuple(found.events),
                   then=(*found.then, *then), hand_over=hand_over or {}, where=dict(where or {}))
