"""Writing events. Every transition calls `record`, inside the transaction of the transition."""

from __future__ import annotations

from django.db import connection, transaction
from django.db.models import sql
from django.utils import timezone

from events.models import Event
from muster import compiled


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


def update_and_record(queryset, updates: dict, project_id: int, subject: str, message: str, *, status: str = "",
                      actor: str = "server", run_id=None, job_id=None, instance_id=None) -> int:
    """`queryset.update(**updates)` and, for each row it touched, the event that says why, as one
    statement on PostgreSQL: a data-modifying WITH whose INSERT reads the UPDATE's RETURNING, so
    a status change is one round trip, and atomic without a transaction of its own (a BEGIN and a
    COMMIT less). Elsewhere (SQLite) the two statements in the caller's transaction. Returns the
    rows updated; no event without an update."""
    entry = {"project_id": project_id, "subject": subject, "message": message, "status": status, "actor": actor,
             "run_id": run_id, "job_id": job_id, "instance_id": instance_id}
    if connection.vendor != "postgresql":
        with transaction.atomic(savepoint=False):
            touched = queryset.update(**updates)
            if touched:
                record_many(project_id, [{k: v for k, v in entry.items() if k not in ("project_id", "actor")}] * touched,
                            actor=actor)
        return touched
    query = queryset.query.chain(sql.UpdateQuery)
    query.add_update_values(updates)
    query.annotations = {}  # as QuerySet.update: none in the statement
    update_sql, update_params = query.get_compiler(queryset.db).as_sql()
    ops = connection.ops
    entry["created"] = timezone.now()
    fields = [(Event._meta.get_field(name), value) for name, value in entry.items()]
    columns = ", ".join(ops.quote_name(f.column) for f, _ in fields)
    values = [f.get_db_prep_save(value, connection) for f, value in fields]
    pk = ops.quote_name(queryset.model._meta.pk.column)
    statement = (f"WITH moved AS ({update_sql} RETURNING {pk}) "
                 f"INSERT INTO {ops.quote_name(Event._meta.db_table)} ({columns}) "
                 f"SELECT {', '.join(['%s'] * len(values))} FROM moved")
    with connection.cursor() as cursor:
        cursor.execute(statement, [*update_params, *values])
        return cursor.rowcount


def update_row_and_record(model, pk, where: dict, updates: dict, project_id: int, subject: str, message: str,
                          **event) -> int:
    """`update_and_record(model.objects.filter(pk=pk, **where), updates, ...)` for one row, its UPDATE
    written once per shape on PostgreSQL (muster/compiled.row_update) instead of built by the ORM on
    every status move. What row_update leaves to the ORM, and SQLite, take update_and_record itself."""
    update = compiled.row_update(model, pk, where, updates) if connection.vendor == "postgresql" else None
    if update is None:
        return update_and_record(model.objects.filter(pk=pk, **where), updates, project_id, subject, message, **event)
    update_sql, update_params = update
    entry = {"project_id": project_id, "subject": subject, "message": message, "status": "", "actor": "server",
             "run_id": None, "job_id": None, "instance_id": None, **event, "created": timezone.now()}
    ops = connection.ops
    pk_column = ops.quote_name(model._meta.pk.column)
    columns = ", ".join(ops.quote_name(Event._meta.get_field(n).column) for n in entry)
    statement = (f"WITH moved AS ({update_sql} RETURNING {pk_column}) "
                 f"INSERT INTO {ops.quote_name(Event._meta.db_table)} ({columns}) "
                 f"SELECT {', '.join(['%s'] * len(entry))} FROM moved")
    values = [Event._meta.get_field(n).get_db_prep_save(v, connection) for n, v in entry.items()]
    with connection.cursor() as cursor:
        cursor.execute(statement, [*update_params, *values])
        return cursor.rowcount
