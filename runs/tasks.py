"""Celery tasks of the runs app: thin wrappers that claim a row and call the owning function."""

from __future__ import annotations

from celery import shared_task

from runs import progress, run_state, scheduling, stopping, sweeps, watching


@shared_task(acks_late=True, reject_on_worker_lost=True)
def provision_job(job_id: int) -> None:
    scheduling.provision_job(job_id)


@shared_task(acks_late=True, reject_on_worker_lost=True)
def advance_job(job_id: int) -> None:
    progress.advance_job(job_id)


@shared_task(acks_late=True, reject_on_worker_lost=True)
def finish_job(job_id: int) -> None:
    stopping.finish_job(job_id)


@shared_task(acks_late=True, reject_on_worker_lost=True)
def process_run(run_id: int) -> None:
    run_state.process_run(run_id)


@shared_task
def watch_running() -> None:
    watching.watch_running()


@shared_task
def sweep() -> None:
    sweeps.sweep()
