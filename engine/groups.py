"""Instance-group lifecycle: find a group, delete it whole, terminate it; stop agents, terminate fleets."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from django.db import transaction
from django.db.models import Q

from backends.base import BackendError
from backends.registry import compute_for_instance, fleet_backend_config, get_compute
from engine import claims, messages
from engine.tuning import STOP_THREADS
from events.services import record
from instances.models import (
    LIVE_INSTANCE_STATUSES,
    Fleet,
    GroupKind,
    GroupStatus,
    Instance,
    InstanceGroup,
    InstanceStatus,
)
from instances.transitions import move_instances
from muster.api_errors import InvalidInput

log = logging.getLogger(__name__)
NOT_TERMINATED = [status for status in InstanceStatus.values if status != InstanceStatus.TERMINATED]


def find_group(project, name: str) -> InstanceGroup | None:
    """A group by its own name, or the group of the instance with that name."""
    group = InstanceGroup.objects.filter(project=project, name=name).exclude(status=GroupStatus.TERMINATED).first()
    if group is None:
        inst = Instance.objects.filter(project=project, name=name, group__isnull=False).select_related("group").first()
        if inst is not None and inst.group.status != GroupStatus.TERMINATED:
            group = inst.group
    return group


def group_in_use(group: InstanceGroup) -> bool:
    from runs.choices import JOB_UNFINISHED
    from runs.models import Job

    return Job.objects.filter(instance__group=group, status__in=JOB_UNFINISHED).exists()


def delete_group(group: InstanceGroup, actor: str = "api", force: bool = False) -> None:
    """Delete the whole group (a TPU pod: one delete call); its instances all end terminated."""
    if mark_for_deletion(group, actor, force):
        messages.terminate_group(group.pk)


def mark_for_deletion(group: InstanceGroup, actor: str = "api", force: bool = False) -> bool:
    """`delete_group` without its message, for a step that holds the group (its Outcome sends it)."""
    if group_in_use(group) and not force:
        raise InvalidInput(["name"], f"{group.name} runs a job: stop the run first (or delete with force=true)")
    if force:
        from engine.stopping import stop_jobs_on_group

        stop_jobs_on_group(group, actor=actor)
    with transaction.atomic():
        touched = InstanceGroup.objects.filter(pk=group.pk).exclude(
            status__in=[GroupStatus.TERMINATING, GroupStatus.TERMINATED]).update(status=GroupStatus.TERMINATING)
        if not touched:
            return False
        move_instances(list(group.instances.filter(status__in=LIVE_INSTANCE_STATUSES)), InstanceStatus.TERMINATING,
                       frm=LIVE_INSTANCE_STATUSES, message="deleting with its group", actor=actor)
        record(group.project_id, f"instance group {group.name}", "deletion requested", status=GroupStatus.TERMINATING, actor=actor)
    group.status = GroupStatus.TERMINATING
    return True


def terminate_group(group_id: int) -> bool:
    """Task body: one backend call for the whole group, then every instance is terminated.
    True when the group was deleted in this call."""
    held = claims.claimed(InstanceGroup, group_id, "terminate_group", _terminate, status=GroupStatus.TERMINATING)
    return held is not None and group_id in held.applied and held.outcome.move is not None


def _terminate(held: claims.Held) -> claims.Outcome | None:
    group = InstanceGroup.objects.select_related("fleet").get(pk=held.pk)
    try:
        if group.kind == GroupKind.TPU_POD:
            backend = group.backend_data.get("backend", "gcp")
            compute = get_compute(backend, fleet_backend_config(group.fleet) if group.fleet else {})
            compute.terminate_group(group.name, group.backend_data)
        else:
            stop_agents(list(group.instances.exclude(status=InstanceStatus.TERMINATED)))
    except BackendError as exc:
        log.warning("deleting group %s failed, will retry: %s", group.name, exc)
        return None  # given back as it is: the sweep sends the delete again
    return claims.Outcome(move=partial(_terminated, group))


def _terminated(group: InstanceGroup, token: str) -> bool:
    """The give-back is the group's final move, with its instances', in one transaction."""
    with transaction.atomic():
        if not InstanceGroup.objects.filter(pk=group.pk, lease_token=token, status=GroupStatus.TERMINATING).update(
                status=GroupStatus.TERMINATED, lease_until=None, lease_token=""):
            return False
        move_instances(list(group.instances.exclude(status=InstanceStatus.TERMINATED)), InstanceStatus.TERMINATED,
                       frm=NOT_TERMINATED, message="terminated with its group")
        record(group.project_id, f"instance group {group.name}", "deleted", status=GroupStatus.TERMINATED)
    return True


def stop_agents(instances: list[Instance]) -> None:
    """Ask the runner agent on each host to exit, up to STOP_THREADS hosts at a time.

    Best effort: a host that is gone cannot stop its agent and is removed anyway. The hosts are
    made here, on this thread (they may read the database); the threads only talk to them, so a
    Celery soft time limit, raised on this thread, ends the task instead of being swallowed.
    """
    hosts = []
    for inst in instances:
        try:
            hosts.append((inst, compute_for_instance(inst).runner_host(inst)))
        except Exception as exc:  # as in _stop_agent: the instance is removed whatever happens here
            log.info("could not reach the runner agent on %s: %s", inst.name, exc)
    if not hosts:
        return
    with ThreadPoolExecutor(max_workers=min(STOP_THREADS, len(hosts)), thread_name_prefix="stop-agent") as pool:
        list(pool.map(lambda pair: _stop_agent(*pair), hosts))


def _stop_agent(inst: Instance, host) -> None:
    try:
        stop = getattr(host, "stop_agent", None)
        if stop:
            stop()
    except Exception as exc:  # a host that is gone cannot stop its agent; it is removed anyway
        log.info("could not stop the runner agent on %s: %s", inst.name, exc)
    finally:
        host.close()


def terminate_fleet_instances(fleet: Fleet, actor: str = "api") -> None:
    for group in fleet.groups.exclude(status__in=[GroupStatus.TERMINATING, GroupStatus.TERMINATED]):
        if group.kind == GroupKind.TPU_POD:
            delete_group(group, actor=actor, force=True)
    loose = list(fleet.instances.filter(Q(group__isnull=True) | Q(group__kind=GroupKind.CLUSTER)).exclude(
        status=InstanceStatus.TERMINATED))
    stop_agents(loose)
    move_instances(loose, InstanceStatus.TERMINATED, frm=NOT_TERMINATED, message="terminated with its fleet",
                   actor=actor, fleet=None)
    fleet.groups.filter(kind=GroupKind.CLUSTER).update(status=GroupStatus.TERMINATED)
