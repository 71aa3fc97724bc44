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
from functools import partial

from engine import messages, outcome
from engine.outcome import Outcome
from runs.choices import JobStatus
from runs.models import Job

HAND_OVER = {JobStatus.TERMINATING: messages.finish_job}


def learn(job: Job, *, event: str = "", then: Callable[[], object] | None = None, **fields) -> None:
    """engine.outcome.learn for the job a step holds; `event`: a message about the job."""
    outcome.learn(job, event=outcome.event(
        job.run.project_id, f"job {job.run.name}/{job.job_num}", event, status=job.status, run_id=job.run_id,
        job_id=job.pk, instance_id=job.instance_id) if event else None, then=then, **fields)


def job_outcome(job: Job, then=(), **fields) -> Outcome:
    """Give `job` back as the step left it, with `fields` and what it learned; `then` are sent only if
    it is still so."""
    if job.status == JobStatus.TERMINATING:
        then = (*then, partial(messages.finish_job, job.pk))
    return outcome.with_learned(job, expect=(job.status,), then=then, hand_over=HAND_OVER, **fields)
