"""Every Celery task of the engine: thin wrappers that call the step (engine/__init__.py maps them)."""

from __future__ import annotations

from celery import shared_task

from engine import (
    admission,
    attach_installs,
    attach_revokes,
    finishing,
    fleet_deletion,
    groups,
    pod_watch,
    pods,
    processing,
    registration,
    router_sync,
    ssh_registration,
    sweeps,
)
from engine.replicas import scaling
from engine.running import watch
from engine.starting import advance
from engine.submitted import provision
from instances.models import Instance
from runs import log_storage

# Redis delivers lower numbers first (other brokers ignore this). Admitting work comes first:
# a submitted job takes its hosts before the starts and ends of jobs that have theirs, so a burst
# of submissions is not queued behind the work of the ones before it. Two levels only: the rest
# shares one, so no kind of task (finish_job gives hosts back) can be starved by another.
FIRST, NEXT = 0, 3


def step_task(**options):
    """A claimed step's task: acknowledged once it ran, and delivered again when its worker was lost
    mid-step (the claim makes a second delivery safe). The beat's periodic tasks are not: the next
    tick does their work anyway."""
    return shared_task(acks_late=True, reject_on_worker_lost=True, **options)


@step_task(priority=FIRST)
def provision_job(job_id: int) -> None:
    provision.provision_job(job_id)


@step_task(priority=NEXT)  # a backstop: never ahead of the job ends and starts
def recheck_jobs(job_ids: list[int]) -> None:
    provision.recheck_jobs(job_ids)


@step_task(priority=NEXT)
def advance_job(job_id: int) -> None:
    advance.advance_job(job_id)


@step_task(priority=NEXT)
def advance_jobs(job_ids: list[int]) -> None:
    advance.advance_jobs(job_ids)


@step_task(priority=NEXT)
def finish_job(job_id: int) -> None:
    finishing.finish_job(job_id)


@step_task(priority=NEXT)
def finish_jobs(job_ids: list[int]) -> None:
    finishing.finish_jobs(job_ids)


@step_task(priority=NEXT)
def process_run(run_id: int) -> None:
    processing.process_run(run_id)


@step_task(priority=NEXT)
def process_runs(run_ids: list[int]) -> None:
    processing.process_runs(run_ids)


@shared_task(priority=NEXT)  # never ahead of the starts it shares the workers with
def watch_running() -> None:
    watch.watch_running()


@shared_task
def sweep() -> dict[str, int]:
    # what it found is returned so /metrics can count recoveries (console/taskstats.py)
    return sweeps.sweep()


@shared_task(priority=NEXT)
def scale_services() -> int:
    return scaling.scale_services()


@step_task(priority=FIRST)
def admit_fleet(fleet_id: int) -> None:
    admission.admit_fleet(fleet_id)


@step_task(priority=NEXT)
def sync_routers(run_id: int) -> None:
    router_sync.sync_routers(run_id)


@shared_task(priority=NEXT)
def sweep_routers() -> int:
    return router_sync.sweep_routers()


@shared_task
def sweep_logs() -> int:
    return log_storage.sweep_retention()


@step_task()
def terminate_group(group_id: int) -> None:
    groups.terminate_group(group_id)


@step_task()
def poll_pod(group_id: int) -> None:
    pods.poll_pod(group_id)


@shared_task(priority=NEXT)
def watch_pods() -> None:
    pod_watch.watch_pods()


@step_task()
def register_fleet(fleet_id: int, actor: str = "server") -> None:
    registration.register_fleet(fleet_id, actor=actor)


@step_task()
def delete_fleet(fleet_id: int, actor: str = "server") -> None:
    fleet_deletion.delete_fleet(fleet_id, actor=actor)


@shared_task
def stop_agents(instance_ids: list[int]) -> None:
    # best effort, as the agents of a deleted fleet: hosts already out of the pool, nothing to claim
    groups.stop_agents(list(Instance.objects.filter(pk__in=instance_ids)))


@shared_task
def stop_registered_agents(hosts: list[dict]) -> None:
    # best effort: the agents a registration started on hosts whose fleet went while it registered
    ssh_registration.stop_registered_agents(hosts)


@step_task(priority=NEXT)
def install_attach_key(grant_id: int) -> None:
    attach_installs.install_attach_key(grant_id)


@step_task(priority=NEXT)
def revoke_attach_keys(instance_id: int) -> None:
    attach_revokes.revoke_attach_keys(instance_id)
