"""Writing events. Every transition calls `record`, inside the transaction of the transition."""

from __future__ import annotations

from events.models import Event


def record(project_id: int, subject: str, message: str, *, status: str = "", actor: str = "server",
           run_id=None, job_id=None, instance_id=None) -> Event:
    return Event.objects.create(
        project_id=project_id, subject=subject, message=message, status=status, actor=actor,
        run_id=run_id, job_id=job_id, instance_id=instance_id,
    )


def record_many(project_id: int, entries: list[dict], *, actor: str = "server") -> None:
    """Several events in one INSERT (a group master moving its members): each entry holds
    `subject`, `message` and optionally `status`, `run_id`, `job_id`, `instance_id`."""
    Event.objects.bulk_create([Event(project_id=project_id, actor=actor, **entry) for entry in entries])
