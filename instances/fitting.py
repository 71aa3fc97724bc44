"""Which fleets can take a run now, and why none can: the placement reads, in one read-only module.

The plan (runs/services/submission.py: `muster apply` shows where a run would go, or why nowhere)
and the engine's placement (engine/submitted/placement.py takes the hosts; provision.py writes the
no-capacity failure) ask the same questions here, so a plan never says "fits" where placement
would fail, nor the other way round. Nothing here writes: taking hosts is the engine's.

Why a run does not fit is instances/fit_reasons.py's, from the same reads.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import islice
from typing import Any

from django.conf import settings

from backends.registry import (
    LOCAL_HOSTS,
    creates_groups,
    fleet_backend,
    fleet_backend_config,
    get_compute,
    written_names,
)
from instances import rows
from instances.models import (
    Fleet,
    Placement,
)
from muster.step_reads import once
from runs.configuration import fits
from runs.configuration.container_policy import fleet_policy, policy_problems, run_has_image
from runs.models import Job, Run


def is_static(fleet: Fleet) -> bool:
    return not creates_groups(fleet.backend)


def group_demands(run: Run, jobs: list[Job] | None = None) -> list[tuple[dict, int]]:
    """(requirements, node count) per group of the run's current submission (or of `jobs`)."""
    demands: dict[int, tuple[dict, int]] = {}
    # run_id is loaded too: the related manager sets `job.run`, which would fetch a deferred run_id per row
    for job in jobs if jobs is not None else run.current_jobs().only("run_id", "node_group_index", "spec"):
        req, count = demands.get(job.node_group_index, (job.spec["resources"], 0))
        demands[job.node_group_index] = (req, count + 1)
    return [demands[k] for k in sorted(demands)]


def page_for(wanted: int) -> int:
    # a little more than is wanted, for rows `fits` rejects or other workers take meanwhile
    return min(64, max(8, 2 * wanted))


def candidates(fleet: Fleet, req: dict, page: int = 32, busy_too: bool = False):
    """Free instances that may fit `req` (free_instances' rows), a page at a time.

    Fewest GPUs first, so a job that does not ask for GPUs (a CPU router) lands on a CPU host
    and leaves the GPU hosts to the groups that need them.

    The indexed columns narrow the query (so its cost does not grow with the fleet); `fits` has
    the last word on each row (GPU names and memory, arch, disk).
    """
    gpu = req.get("gpu")
    tpu = bool(gpu and gpu.get("tpu"))
    gpus = (gpu.get("count") or {}).get("min") or 0 if not tpu and gpu else None
    cpus, memory_gb = (req.get("cpu") or {}).get("min") or 0, (req.get("memory") or {}).get("min") or 0
    after = None
    while True:
        # keyset paging: rows other workers claim meanwhile drop out without shifting the pages
        found = rows.candidate_page(fleet.pk, busy_too, cpus, memory_gb, tpu, gpus, after, page)
        for inst in found:
            if fits(req, inst.resources):
                yield inst
        if len(found) < page:
            return
        after = (found[-1].gpu_count, found[-1].id)


def static_fleet_fits(fleet: Fleet, demands: list[tuple[dict, int]], pools: list | None = None,
                      at_least: Callable[[int], int] | None = None, busy_too: bool = False) -> bool:
    """Can the fleet's idle instances hold every group at once (each instance one job)?

    Each group looks at no more candidates than the run has nodes: a group with that many can
    always be served whatever the other groups take, so the greedy answer stays exact. `at_least`
    (a group's node count -> candidates) reads more per group, for a caller that shows them
    (`pools` gets what was read): a group that has more still goes after the scarce ones, so the
    answer is the same. `busy_too`: whether it could once the fleet's busy hosts are free again.
    """
    total = sum(n for _, n in demands)
    read = [max(total, at_least(n)) if at_least else total for _, n in demands]
    found = [list(islice(candidates(fleet, req, page_for(k), busy_too), k)) for (req, _), k in zip(demands, read, strict=True)]
    if pools is not None:
        pools[:] = found
    taken: set[int] = set()
    for g in sorted(range(len(demands)), key=lambda g: min(len(found[g]), total)):
        need = demands[g][1]
        pick = [i for i in found[g] if i.id not in taken][:need]
        if len(pick) < need:
            return False
        taken.update(i.id for i in pick)
    return True


def cloud_fleet_fits(fleet: Fleet, demands: list[tuple[dict, int]]) -> bool:
    compute = get_compute(fleet.backend, fleet_backend_config(fleet))
    return all(compute.get_offers(req) for req, _ in demands)


def local_allowed(user) -> bool:
    """Whether `user`'s runs may go to local fleets. A local job is a shell on the control plane as
    the server's user (its database, keys and every token), so: superusers' runs, and every
    writer's only where the operator opened them with MUSTER_LOCAL_FLEET_MEMBERS=1."""
    return bool(settings.MUSTER["LOCAL_FLEET_MEMBERS"]) or bool(user is not None and user.is_superuser)


def usable_fleets(run: Run) -> list[Fleet]:
    """The active fleets the run may use (its `fleets:`, local ones only for whom they allow),
    before their container policies are asked: what placement tries and what its failure explains."""
    return fleets_for(run.project_id, run.configuration.get("fleets") or [], local=local_allowed(run.user),
                      backends=run_backends(run.configuration))


def candidate_fleets(run: Run, usable: list[Fleet] | None = None) -> list[Fleet]:
    """The fleets the run may go to: `usable` (read here when not given) that allow its containers."""
    return allowing_fleets(usable_fleets(run) if usable is None else usable, run.configuration)


def allowing_fleets(fleets: list[Fleet], configuration: dict) -> list[Fleet]:
    """The fleets whose container policy lets the run's containers do what they ask (privileged,
    host volumes): a run never goes to a fleet that forbids it, even when that fleet fits."""
    return [f for f in fleets if not policy_refusals(f, configuration)]


def policy_refusals(fleet: Fleet, configuration: dict) -> list[str]:
    """What the run's containers ask that the fleet's policy does not allow (none without an image)."""
    if not run_has_image(configuration):
        return []
    container = configuration.get("container") or {}
    return [msg for _, msg in policy_problems(container, fleet_policy(fleet.configuration, fleet.backend), fleet.name)]


def run_backends(configuration: dict | None) -> list[str] | None:
    """The run's `backends:` as written (None: any fleet's kind will do)."""
    return ((configuration or {}).get("profile") or {}).get("backends")


def fleets_for(project_id: int, wanted: list[str], local: bool = True,
               backends: list[str] | None = None) -> list[Fleet]:
    """The project's active fleets a run may use: those it names in `fleets:` in that order, else all;
    local fleets only with `local` (local_allowed of the run's user); of the kinds its `backends:`
    names, if it names any (a backend Muster lacks has no fleet here: as in dstack, none fits)."""
    kinds = None
    if backends is not None:
        # dstack's names of the kinds of fleet Muster has (`remote` is dstack's for SSH fleets)
        kinds = sorted({fleet_backend([name]) for name in backends if name in written_names()})
        if not kinds:
            return []
    # the project's own fleets, then those other projects share with it (instances/shares.py); read
    # once per step (muster/step_reads.py): an admission look asks it for each run it places
    not_backend = None if local else LOCAL_HOSTS
    fleets = list(once(("fleets", project_id, not_backend, tuple(kinds) if kinds is not None else None, tuple(wanted)),
                       lambda: rows.active_fleets(project_id, not_backend, kinds, wanted)))
    if wanted:
        order = {name: i for i, name in enumerate(wanted)}
        return sorted(fleets, key=lambda f: order[written_name(f)])
    return fleets


def shared_fleets(project_id: int, names: list[str]) -> list[Fleet]:
    """The active fleets other projects share with this one called `owner/name` in `names`."""
    return [f for f in rows.active_fleets(project_id, None, None, names) if f.project_id != project_id]


def written_name(fleet: Fleet) -> str:
    """How a run names the fleet: `name`, or `owner/name` for another project's fleet shared with it."""
    owner = getattr(fleet, "shared_from", None)
    return f"{owner}/{fleet.name}" if owner else fleet.name


def first_fitting_fleet(fleets: list[Fleet], demands: list[tuple[dict, int]], pools: list | None = None,
                        at_least: Callable[[int], int] | None = None, busy_too: bool = False) -> Fleet | None:
    """`pools`, `at_least`, `busy_too`: as static_fleet_fits, for the fleet returned."""
    multi_node = sum(n for _, n in demands) > 1
    for fleet in fleets:
        static = is_static(fleet)
        if multi_node and static and fleet.placement != Placement.CLUSTER:
            continue  # nodes of one run must reach each other on a private network
        if static and static_fleet_fits(fleet, demands, pools, at_least, busy_too):
            return fleet
        if not static and cloud_fleet_fits(fleet, demands):
            return fleet
    return None


Group = tuple[str, dict, int]  # (group name, normalized resources requirement, node count)

LOCAL_REFUSED = ("the project's fleets that the run may use are local fleets, which run only superusers' runs (a "
                 "local job is a shell on the control plane; an operator can open them to every member with "
                 "MUSTER_LOCAL_FLEET_MEMBERS=1): use an ssh or gcp fleet")


def groups_of(jobs: list[Any], name: Callable, index: Callable, resources: Callable) -> list[Group]:
    """(name, requirements, node count) per group, in group order, from job rows or job specs."""
    found: dict[int, list] = {}
    for job in jobs:
        entry = found.setdefault(index(job), [name(job), resources(job), 0])
        entry[2] += 1
    return [tuple(found[k]) for k in sorted(found)]
