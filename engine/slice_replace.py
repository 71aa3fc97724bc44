"""One lost slice of a multislice set made again while the set's other slices are kept
(`on_slice_failure: replace-slice`); the default, `whole-set`, is pod_watch.interrupt_pod.

Called by the pod watch (which holds the pod) when its backend says which slice of a live set is
lost. In one step, one transaction whose first write is the pod's lease-guarded move (a lease
lost while the plan was worked out writes nothing at all): every job of the set ends as an
interruption that keeps its host (`Job.keep_host`), the lost slice's hosts go back to `provisioning`, and the pod goes back to
`provisioning` with the backend's plan for the new slice (`Compute.replace_part`: the lost node
retired and deleted on the next poll, a new node id, pinned to the kept slices' zone). From
there the pod's ordinary polls (engine/pods.py) create the slice with the usual zone, lost-answer
and adoption rules and fill its hosts in; process_run restarts every job of the set on the same
hosts (engine/restarts.py, counted against the group's `max_restarts`, no backoff: the new
slice's creation is the wait), and the kept slices' jobs wait for the new hosts' addresses
before their runners are handed the new coordinator (slice 0 worker 0, whichever slice was lost).

When it cannot be done (another policy, more than one slice lost, a queued set, the kept slices in
more than one zone, the restart budget spent) the caller takes the whole set, as before, with
the reason in its message.
"""

from __future__ import annotations

import logging
import time
from functools import partial

from django.db import transaction

from backends.base import BackendError, GroupWatch
from backends.registry import compute_for_group
from engine import claims, messages, outcome
from engine.failure_policy import max_restarts, restart_record
from events.services import record
from instances.models import GroupStatus, InstanceGroup, InstanceStatus
from instances.transitions import move_group, move_instances
from muster.claimable import Lease
from runs.choices import JOB_ACTIVE, JobReason
from runs.configuration.stored import run_configuration
from runs.models import Job
from runs.transitions import terminate_job

log = logging.getLogger(__name__)
REPLACE = "replace-slice"


def replace_lost_slice(group: InstanceGroup, watch: GroupWatch, lease: Lease) -> claims.Outcome | str:
    """The pod's outcome once the replacement is under way, or why the whole set goes instead."""
    jobs = list(Job.objects.filter(instance__group=group, status__in=JOB_ACTIVE).select_related("run"))
    if not jobs:
        return ""  # nothing runs on it: nothing to keep it for
    run, index = jobs[0].run, jobs[0].node_group_index
    conf = run_configuration(run)
    if conf.group(index).on_slice_failure != REPLACE:
        return ""
    lost = watch.lost_parts[0]
    retry = getattr(conf, "retry", None)
    until = time.time() + (retry.duration if retry and "interruption" in retry.on_events else 0)
    try:  # (no call to the provider: the plan for the next polls, or why there can be none)
        data = compute_for_group(group).replace_part(group.name, group.backend_data, lost, until)
    except BackendError as exc:
        return f"replace-slice: {exc}"
    if len(watch.lost_parts) != 1:
        return f"slices {', '.join(map(str, watch.lost_parts))} lost together: replace-slice replaces one"
    done, budget = int(restart_record(run, index).get("count", 0)), max_restarts(run, index)
    if done >= budget:
        return f"replace-slice: max_restarts ({budget}) spent"
    slices = int(group.backend_data.get("slices") or 1)
    hosts = list(group.instances.order_by("index"))
    per_slice = len(hosts) // slices
    gone = hosts[lost * per_slice:(lost + 1) * per_slice]
    why = f"slice {lost} of {slices} lost: {watch.part_lost}"
    log.warning("pod %s: %s; replacing that slice, keeping the others", group.name, why)
    # The group's move is the guarded write and goes first: when the lease was lost (or the pod moved
    # under the step) nothing else is written, and a failure past it rolls all of it back.
    status = group.status
    with transaction.atomic():
        if not move_group(group, GroupStatus.PROVISIONING, frm=[GroupStatus.ACTIVE],
                          message=f"replacing slice {lost}", lease=lease, backend_data=data):
            return not_moved(group)
        record(group.project_id, f"instance group {group.name}",
               f"{why}; replacing it (on_slice_failure: replace-slice), keeping slices "
               f"{', '.join(str(i) for i in range(slices) if i != lost)} and their hosts", status=status,
               run_id=run.pk)
        for job in jobs:
            terminate_job(job, JobReason.INTERRUPTED_BY_NO_CAPACITY, f"{why}: the set restarts once it is "
                          f"replaced", keep_host=True)
        move_instances(gone, InstanceStatus.PROVISIONING, frm=[InstanceStatus.BUSY, InstanceStatus.IDLE],
                       message=f"slice {lost} lost: made again", run_id=run.pk)
    return outcome.with_learned(group, expect=(GroupStatus.PROVISIONING,),
                                then=(partial(messages.poll_pod, group.pk, 0),))


def not_moved(group: InstanceGroup) -> claims.Outcome:
    """The outcome of a watch whose move of the pod found it no longer held as it was: nothing was
    written; a pod deleted under the step gets its delete again (the delete's message bounced off
    the lease), and a lost lease drops the outcome (the new holder looks for itself)."""
    return outcome.with_learned(group, expect=(GroupStatus.ACTIVE,),
                                hand_over={GroupStatus.TERMINATING: messages.terminate_group})


def waits_for_replacement(jobs: list[Job]) -> bool:
    """Some peer's host is a slice being made again: the peers wait for it as long as its pod's poll
    lets it take (WAITING_INSTANCE_LIMIT, `retry.duration` for capacity), not WAITING_PEERS_LIMIT."""
    return any(j.instance is not None and j.instance.status == InstanceStatus.PROVISIONING
               and j.instance.group_id and j.instance.group.status == GroupStatus.PROVISIONING
               and (j.instance.group.backend_data.get("create") or {}).get("replaced_at") for j in jobs)
