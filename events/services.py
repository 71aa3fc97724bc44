"""Writing events. Every transition calls `record`, inside the transaction of the transition."""

from __future__ import annotations

from django.db import connection, transaction

from events import rows
from events.models import Event
from muster import compiled
from muster.rows import one_statement


def record(project_id: int, subject: str, message: str, *, status: str = "", actor: str = "server",
           run_id=None, job_id=None, instance_id=None) -> Event:
    return Event.objects.create(
        project_id=project_id, subject=subject, message=message, status=status, actor=actor,
        run_id=run_id, job_id=job_id, instance_id=instance_id,
    )


def record_many(project_id: int, entries: list[dict], *, actor: str = "server") -> None:
    """Several events in one INSERT (a group master moving its members): each entry holds
    `subject`, `message` and optionally `status`, `run_id`, `job_id`, `instance_id`."""
    record_each([(project_id, entry) for entry in entries], actor=actor)


def record_each(entries: list[tuple[int, dict]], *, actor: str = "server") -> None:
    """record_many for events of several projects ((project id, entry) each), in one INSERT."""
    Event.objects.bulk_create([Event(project_id=project_id, actor=actor, **entry) for project_id, entry in entries])


def update_and_record(queryset, updates: dict, project_id: int, subject: str, message: str, *, status: str = "",
                      actor: str = "server", run_id=None, job_id=None, instance_id=None) -> int:
    """`queryset.update(**updates)` and, for each row it touched, the event that says why, as one
    statement on PostgreSQL (events/rows.update_with_event), so a status change is one round trip,
    and atomic without a transaction of its own (a BEGIN and a COMMIT less). Elsewhere (SQLite)
    the two statements in the caller's transaction. Returns the rows updated; no event without an
    update."""
    entry = {"project_id": project_id, "subject": subject, "message": message, "status": status, "actor": actor,
             "run_id": run_id, "job_id": job_id, "instance_id": instance_id}
    if not one_statement(connection):
        return _with_orm(queryset, updates, entry)
    return rows.update_with_event(compiled.update_of(queryset, updates), queryset.model._meta.pk.column, entry)


def _with_orm(queryset, updates: dict, entry: dict) -> int:
    with transaction.atomic(savepoint=False):
        touched = queryset.update(**updates)
        if touched:
            record_many(entry["project_id"], [{k: v for k, v in entry.items() if k not in ("project_id", "actor")}]
                        * touched, actor=entry["actor"])
    return touched


def update_row_and_record(model, pk, where: dict, updates: dict, project_id: int, subject: str, message: str,
                          **event) -> int:
    """`update_and_record(model.objects.filter(pk=pk, **where), updates, ...)` for one row, its UPDATE
    written once per shape on PostgreSQL (muster/compiled.row_update) instead of built by the ORM on
    every status move; what row_update leaves to the ORM, the ORM compiles."""
    entry = {"project_id": project_id, "subject": subject, "message": message, "status": "", "actor": "server",
             "run_id": None, "job_id": None, "instance_id": None, **event}
    if not one_statement(connection):
        return _with_orm(model.objects.filter(pk=pk, **where), updates, entry)
    update = compiled.row_update(model, pk, where, updates) or compiled.update_of(
        model.objects.filter(pk=pk, **where), updates)
    return rows.update_with_event(update, model._meta.pk.column, entry)
