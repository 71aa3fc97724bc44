"""The Outcome of a step that holds a job (engine/claims.py applies it): the one give-back of a job.

The job goes back guarded by the status the step left it in. A job the step ended itself
(`runs.transitions.end_job`: `terminating`) has its finish_job sent once it is free; a job that
turned `terminating` under the step (a user stop, a teardown: their finish_job bounced off the
step's lease) is found by the guard and handed over to finish_job the same way.
"""

from __future__ import annotations

from functools import partial

from engine import messages
from engine.claims import Outcome
from runs.choices import JobStatus
from runs.models import Job

HAND_OVER = {JobStatus.TERMINATING: messages.finish_job}


def job_outcome(job: Job, then=(), **fields) -> Outcome:
    """Give `job` back as the step left it, with `fields`; `then` are sent only if it is still so."""
    if job.status == JobStatus.TERMINATING:
        then = (*then, partial(messages.finish_job, job.pk))
    return Outcome(expect=(job.status,), fields=fields, then=tuple(then), hand_over=HAND_OVER)
