"""Instance groups and fleets ending, in the engine: a group deleted with its backend (one call for a
TPU pod), the runner agents of hosts stopped (`stop_agents`, the one fan-out that does), a fleet's
hosts ended (`terminate_fleet_instances`, from the claimed step in engine/fleet_deletion.py)."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from django.db import transaction
from django.db.models import Q

from backends.base import BackendError
from backends.registry import compute_for_group, compute_for_instance
from engine import claims, messages, outcome
from engine.finishing import stop_jobs_on_group
from engine.tuning import DELETE_BACKOFF_MAX, STOP_THREADS
from instances.models import (
    Fleet,
    GroupKind,
    GroupStatus,
    Instance,
    InstanceGroup,
    InstanceStatus,
)
from instances.transitions import NOT_TERMINATED, end_group, move_group, move_instances
from muster.claimable import Lease

log = logging.getLogger(__name__)


def end_group_and_jobs(group: InstanceGroup, actor: str = "server") -> bool:
    """The engine's own deletion of a group (its fleet is deleted, Google took the slice back): its
    active jobs end, then the group (the API's delete, which refuses a group in use, is
    instances/services/groups.py). Sends no terminate_group: the caller does, or its Outcome."""
    with transaction.atomic():
        stop_jobs_on_group(group, actor=actor)
        return end_group(group, actor=actor)


def terminate_group(group_id: int) -> bool:
    """Task body: one backend call for the whole group, then every instance is terminated.
    True when the group was deleted in this call."""
    held = claims.claimed(InstanceGroup, group_id, "terminate_group", _terminate, status=GroupStatus.TERMINATING)
    return held is not None and group_id in held.applied and held.outcome.move is not None


def _terminate(held: claims.Held) -> claims.Outcome | None:
    group = InstanceGroup.objects.select_related("fleet").get(pk=held.pk)
    try:
        if group.kind == GroupKind.TPU_POD:
            # the fleet's settings, or the server's and what the group kept when its fleet is gone
            # (a fleet's deletion removes its row before this step runs)
            compute = compute_for_group(group)
            compute.terminate_group(group.name, group.backend_data)
        else:
            stop_agents(list(group.instances.exclude(status=InstanceStatus.TERMINATED)))
    except BackendError as exc:
        return _failed_delete(group, exc)
    return claims.Outcome(move=partial(_terminated, group))


def _failed_delete(group: InstanceGroup, exc: BackendError) -> claims.Outcome:
    """Given back with a backoff that doubles per failure (one lease, two, ... up to
    DELETE_BACKOFF_MAX): the sweep sends the delete again only once it is over. The count is kept
    on the group, and each failure is an event, so why a slice is still there can be read."""
    failures = int(group.backend_data.get("delete_failures") or 0) + 1
    wait = min(claims.backoff_seconds() * 2 ** min(failures - 1, 16), DELETE_BACKOFF_MAX)
    log.warning("deleting group %s failed (%d times), trying again in %.0fs: %s", group.name, failures, wait, exc)
    said = outcome.event(group.project_id, f"instance group {group.name}",
                         f"delete failed ({failures} times), trying again in {wait:.0f}s: {exc}"[:500],
                         status=group.status)
    return claims.Outcome(fields={"backend_data": {**group.backend_data, "delete_failures": failures}},
                          events=(said,), retry_in=wait)


def _terminated(group: InstanceGroup, *, lease: Lease) -> bool:
    """The give-back is the group's final move, with its instances', in one transaction."""
    with transaction.atomic():
        # the lease goes with the final move; a stale token moves nothing
        if not move_group(group, GroupStatus.TERMINATED, frm=[GroupStatus.TERMINATING], message="deleted",
                          lease=lease):
            return False
        move_instances(list(group.instances.exclude(status=InstanceStatus.TERMINATED)), InstanceStatus.TERMINATED,
                       frm=NOT_TERMINATED, message="terminated with its group")
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
            hosts.append((inst.name, compute_for_instance(inst).runner_host(inst)))
        except Exception as exc:  # as in _stop_agent: the instance is removed whatever happens here
            log.info("could not reach the runner agent on %s: %s", inst.name, exc)
    stop_agents_on(hosts)


def stop_agents_on(hosts: list[tuple[str, object]]) -> None:
    """The fan-out itself, for hosts already made ((name, runner host) pairs): every stop of
    runner agents goes through here (a group or fleet deleted, a registration refused)."""
    if not hosts:
        return
    with ThreadPoolExecutor(max_workers=min(STOP_THREADS, len(hosts)), thread_name_prefix="stop-agent") as pool:
        list(pool.map(lambda pair: _stop_agent(*pair), hosts))


def _stop_agent(name: str, host) -> None:
    try:
        host.stop_agent()
    except Exception as exc:  # a host that is gone cannot stop its agent; it is removed anyway
        log.info("could not stop the runner agent on %s: %s", name, exc)
    finally:
        host.close()


def terminate_fleet_instances(fleet: Fleet, actor: str = "api") -> None:
    for group in fleet.groups.exclude(status__in=[GroupStatus.TERMINATING, GroupStatus.TERMINATED]):
        if group.kind == GroupKind.TPU_POD and end_group_and_jobs(group, actor=actor):
            messages.terminate_group(group.pk)
    loose = list(fleet.instances.filter(Q(group__isnull=True) | Q(group__kind=GroupKind.CLUSTER)).exclude(
        status=InstanceStatus.TERMINATED))
    stop_agents(loose)
    move_instances(loose, InstanceStatus.TERMINATED, frm=NOT_TERMINATED, message="terminated with its fleet",
                   actor=actor, fleet=None)
    for group in fleet.groups.filter(kind=GroupKind.CLUSTER).exclude(status=GroupStatus.TERMINATED):
        move_group(group, GroupStatus.TERMINATED, frm=[s for s in GroupStatus.values if s != GroupStatus.TERMINATED],
                   message=f"terminated with fleet {fleet.name}", actor=actor)
