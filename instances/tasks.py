from __future__ import annotations

from celery import shared_task

from instances import lifecycle


@shared_task(acks_late=True, reject_on_worker_lost=True)
def terminate_group(group_id: int) -> None:
    lifecycle.terminate_group_now(group_id)


@shared_task(acks_late=True, reject_on_worker_lost=True)
def poll_pod(group_id: int) -> None:
    from instances import pods

    pods.poll_pod(group_id)


@shared_task(acks_late=True, reject_on_worker_lost=True)
def register_ssh_fleet(fleet_id: int, actor: str = "server") -> None:
    from instances.services import ssh_fleets

    ssh_fleets.complete_registration(fleet_id, actor=actor)
