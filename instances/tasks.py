"""Celery tasks of the instances app; the engine's own tasks are in engine/tasks.py."""

from __future__ import annotations

from celery import shared_task


@shared_task(acks_late=True, reject_on_worker_lost=True)
def register_ssh_fleet(fleet_id: int, actor: str = "server") -> None:
    from instances.services import ssh_fleets

    ssh_fleets.complete_registration(fleet_id, actor=actor)
