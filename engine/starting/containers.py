"""What the server reads from a container job's runner status: pull progress and container errors.

The runner (runner/images.py) pulls the image while its job is in state `pulling` and
reports the progress as `message`; a failed pull or container creation ends the job with
`reason: creating_container_error` and Docker's own message.
"""

from __future__ import annotations

from events.models import Event
from events.services import record
from runs.choices import JobReason, JobStatus, RunnerState
from runs.models import Job


def show_pull_progress(job: Job, state: dict) -> None:
    """An event for each new pull message of the job (`layers done/seen`), none for a repeat; the
    runner keeps the last one (`pull_message`) once it has moved on, for a pull shorter than a poll."""
    message = str((state.get("message") if state.get("state") == RunnerState.PULLING else state.get("pull_message")) or "")
    message = message[:500]
    if not message:
        return
    last = Event.objects.filter(job_id=job.pk).order_by("-created", "-pk").values_list("message", flat=True).first()
    if last != message:
        record(job.run.project_id, f"job {job.run.name}/{job.job_num}", message, status=JobStatus.PULLING,
               run_id=job.run_id, job_id=job.pk, instance_id=job.instance_id)


def container_end(state: dict) -> tuple[str, str] | None:
    """(reason, message) when the runner could not create the job's container, else None."""
    if state.get("state") == RunnerState.FAILED and state.get("reason") == JobReason.CREATING_CONTAINER_ERROR:
        return JobReason.CREATING_CONTAINER_ERROR, str(state.get("error") or "")[:4000]
    return None
