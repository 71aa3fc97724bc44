"""Watching live groups at their provider (TPU pods at Google): a group taken back ends its jobs
as one unit. Only the backend contract is used (`watch_groups`).

A spot slice is preempted whole, a queued resource is SUSPENDED, a slice reaches end of life
(TERMINATED) or simply disappears. The hosts may still answer SSH for a while, or never again;
either way waiting for the SSH grace period would say "host unreachable" late and would leave the
slice billed. So beat sends `watch_pods` every POD_POLL_INTERVAL: it claims the active pods, asks
the backend with one list per zone and fleet (not one call per node), and for each pod that is
lost ends every job on it with `interrupted_by_no_capacity` (the `interruption` retry event) and
deletes the pod (with force for a queued resource). A pod in maintenance counts as lost once it
has been so for TPU_MAINTENANCE_GRACE.
"""

from __future__ import annotations

import logging
import time
from functools import partial

from django.conf import settings
from django.db import transaction

from backends.base import BackendError
from backends.registry import compute_for_group, group_noun
from engine import claims, messages, outcome
from engine.slice_replace import not_moved, replace_lost_slice
from engine.tuning import POD_WATCH_BATCH as BATCH
from events.services import record
from instances.models import GroupKind, GroupStatus, InstanceGroup
from instances.transitions import end_group
from muster.claimable import Lease
from runs.choices import JOB_ACTIVE, JobReason
from runs.models import Job
from runs.transitions import terminate_job

log = logging.getLogger(__name__)


def watch_pods() -> int:
    """Task body: one look at every active pod; returns how many were looked at."""
    due = InstanceGroup.objects.filter(kind=GroupKind.TPU_POD, status=GroupStatus.ACTIVE, fleet__isnull=False)
    return len(claims.claimed_batch(due, BATCH, "watch_pods", _watch).pks)


def _watch(held: claims.Held) -> dict[int, claims.Outcome]:
    groups = list(held.rows(InstanceGroup.objects.select_related("fleet")))
    by_fleet: dict[int, list[InstanceGroup]] = {}
    for group in groups:
        by_fleet.setdefault(group.fleet_id, []).append(group)
    outcomes: dict[int, claims.Outcome] = {}
    for members in by_fleet.values():
        outcomes.update(_watch_fleet(members, held))
    return outcomes


def _watch_fleet(groups: list[InstanceGroup], held: claims.Held) -> dict[int, claims.Outcome]:
    """The outcomes of the pods found lost (the others go back as they are)."""
    fleet = groups[0].fleet
    try:
        compute = compute_for_group(groups[0])
        seen = compute.watch_groups({g.name: g.backend_data for g in groups})
    except BackendError as exc:
        # An API that does not answer says nothing about the slices: the next tick looks again.
        log.info("fleet %s: could not watch its groups: %s", fleet.name, exc)
        return {}
    grace = float(settings.MUSTER["TPU_MAINTENANCE_GRACE"])
    outcomes = {}
    for group in groups:
        watch = seen.get(group.name)
        if watch is None:
            continue
        with held.row(group.pk):
            why = watch.lost or _maintenance_over(group, watch.maintenance, grace)
            if why and watch.lost_parts:
                replaced = replace_lost_slice(group, watch, held.lease)
                if not isinstance(replaced, str):
                    outcomes[group.pk] = replaced
                    continue
                why = f"{why}; {replaced}" if replaced else why
            outcomes[group.pk] = interrupt_pod(group, why, held.lease) if why else outcome.with_learned(group)
    return outcomes


def _maintenance_over(group: InstanceGroup, maintenance: str, grace: float) -> str:
    """The maintenance message once it has lasted past the grace; "" before (or without one)."""
    since = group.backend_data.get("maintenance_since")
    if not maintenance:
        if since is not None:
            _store(group, maintenance_since=None)
        return ""
    if since is None:
        _store(group, maintenance_since=time.time())
        return ""
    return f"{maintenance} for {time.time() - since:.0f}s" if time.time() - since > grace else ""


def _store(group: InstanceGroup, **changes) -> None:
    outcome.learn(group, backend_data={**group.backend_data, **changes})  # written with the watch's give-back


def interrupt_pod(group: InstanceGroup, why: str, lease: Lease) -> claims.Outcome:
    """Google took the slice back: every job on it ends as an interruption, and the pod is deleted
    (its terminate_group is sent once the watch gives the pod back)."""
    log.warning("%s %s lost: %s", group_noun(group), group.name, why)
    status = group.status
    # the group's guarded move first: a lost lease writes nothing (no job ended for a pod kept)
    with transaction.atomic():
        if not end_group(group, actor="server", lease=lease):
            return not_moved(group)
        record(group.project_id, f"instance group {group.name}", f"lost: {why}", status=status)
        for job in Job.objects.filter(instance__group=group, status__in=JOB_ACTIVE).select_related("run"):
            terminate_job(job, JobReason.INTERRUPTED_BY_NO_CAPACITY, f"{group_noun(group)} {group.name}: {why}")
    return outcome.with_learned(group, expect=(GroupStatus.TERMINATING,),
                                then=(partial(messages.terminate_group, group.pk),))
