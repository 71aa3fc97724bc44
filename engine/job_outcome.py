"""The Outcome of a step that holds a job (engine/claims.py applies it): the one give-back of a job.

The job goes back guarded by the status the step left it in. A job the step ended itself
(`runs.transitions.end_job`: `terminating`) has its finish_job sent once it is free; a job that
turned `terminating` under the step (a user stop, a teardown: their finish_job bounced off the
step's lease) is found by the guard and handed over to finish_job the same way.

What a step finds out about its job on the way (the runner took the job, what it waits for, its
probes) is `learn`ed: set on the step's copy at once, and written with the give-back, with the
events that say so, never by a write of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from engine import messages
from engine.outcome import Outcome
from engine.outcome import event as claims_event
from runs.choices import JobStatus
from runs.models import Job

HAND_OVER = {JobStatus.TERMINATING: messages.finish_job}


@dataclass
class _Learned:
    fields: dict = field(default_factory=dict)
    events: list = field(default_factory=list)
    then: list = field(default_factory=list)


def learn(job: Job, *, event: str = "", then: Callable[[], object] | None = None, **fields) -> None:
    """Note what the step holding `job` found out: `fields` go on its copy now and into its row with the
    give-back (job_outcome), with `event` (a message about the job) in the same transaction and
    `then` sent once the job is free (a peer that waits for what was learned looks again)."""
    learned = job.__dict__.setdefault("_learned", _Learned())
    for name, value in fields.items():
        setattr(job, name, value)
    learned.fields.update(fields)
    if event:
        learned.events.append(claims_event(job.run.project_id, f"job {job.run.name}/{job.job_num}", event,
                                           status=job.status, run_id=job.run_id, job_id=job.pk,
                                           instance_id=job.instance_id))
    if then is not None:
        learned.then.append(then)


def job_outcome(job: Job, then=(), **fields) -> Outcome:
    """Give `job` back as the step left it, with `fields` and what it learned; `then` are sent only if
    it is still so."""
    learned = job.__dict__.pop("_learned", None) or _Learned()
    then = (*learned.then, *then)
    if job.status == JobStatus.TERMINATING:
        then = (*then, partial(messages.finish_job, job.pk))
    return Outcome(expect=(job.status,), fields={**learned.fields, **fields}, events=tuple(learned.events),
                   then=tuple(then), hand_over=HAND_OVER)
