"""Where a run goes: the fleet that can hold every group, and the instance each job takes."""

from __future__ import annotations

from itertools import islice

from django.db.models import Q
from django.utils import timezone

from backends.registry import creates_groups, fleet_backend_config, get_compute
from instances.models import Fleet, FleetStatus, Instance, InstanceStatus
from runs.configuration import fits
from runs.models import Job, Run


def is_static(fleet: Fleet) -> bool:
    return not creates_groups(fleet.backend)


def group_demands(run: Run) -> list[tuple[dict, int]]:
    """(requirements, node count) per group of the run's current submission."""
    demands: dict[int, tuple[dict, int]] = {}
    for job in run.current_jobs().only("node_group_index", "spec"):
        req, count = demands.get(job.node_group_index, (job.spec["resources"], 0))
        demands[job.node_group_index] = (req, count + 1)
    return [demands[k] for k in sorted(demands)]


def free_instances(fleet: Fleet):
    # Instance.objects, not fleet.instances: the related manager would set `fleet` on every row
    # and, with .only(), fetch each row's deferred fleet_id in a query of its own.
    return Instance.objects.filter(
        Q(group__isnull=True) | Q(group__kind="cluster"), fleet=fleet, status=InstanceStatus.IDLE, unreachable=False
    )


def candidates(fleet: Fleet, req: dict, page: int = 32):
    """Free instances that may fit `req`, a page at a time.

    Fewest GPUs first, so a job that does not ask for GPUs (a CPU router) lands on a CPU host
    and leaves the GPU hosts to the groups that need them.

    The indexed columns narrow the query (so its cost does not grow with the fleet); `fits` has
    the last word on each row (GPU names and memory, arch, disk).
    """
    qs = free_instances(fleet).filter(cpus__gte=(req.get("cpu") or {}).get("min") or 0,
                                      memory_gb__gte=(req.get("memory") or {}).get("min") or 0)
    gpu = req.get("gpu")
    if gpu and gpu.get("tpu"):
        qs = qs.exclude(tpu="")
    else:
        qs = qs.filter(tpu="")
        if gpu:
            qs = qs.filter(gpu_count__gte=(gpu.get("count") or {}).get("min") or 0)
    qs = qs.order_by("gpu_count", "id").only("id", "name", "resources", "gpu_count")
    after = Q()
    while True:
        # keyset paging: rows other workers claim meanwhile drop out without shifting the pages
        rows = list(qs.filter(after)[:page])
        for inst in rows:
            if fits(req, inst.resources):
                yield inst
        if len(rows) < page:
            return
        last = rows[-1]
        after = Q(gpu_count__gt=last.gpu_count) | Q(gpu_count=last.gpu_count, id__gt=last.id)


def static_fleet_fits(fleet: Fleet, demands: list[tuple[dict, int]]) -> bool:
    """Can the fleet's idle instances hold every group at once (each instance one job)?

    Each group looks at no more candidates than the run has nodes: a group with that many can
    always be served whatever the other groups take, so the greedy answer stays exact.
    """
    total = sum(n for _, n in demands)
    pools = [list(islice(candidates(fleet, req), total)) for req, _ in demands]
    taken: set[int] = set()
    for g in sorted(range(len(demands)), key=lambda g: len(pools[g])):
        need = demands[g][1]
        pick = [i for i in pools[g] if i.id not in taken][:need]
        if len(pick) < need:
            return False
        taken.update(i.id for i in pick)
    return True


def cloud_fleet_fits(fleet: Fleet, demands: list[tuple[dict, int]]) -> bool:
    compute = get_compute(fleet.backend, fleet_backend_config(fleet))
    return all(compute.get_offers(req) for req, _ in demands)


def candidate_fleets(run: Run):
    fleets = Fleet.objects.filter(project=run.project, status=FleetStatus.ACTIVE)
    wanted = run.configuration.get("fleets") or []
    if wanted:
        fleets = fleets.filter(name__in=wanted)
        order = {name: i for i, name in enumerate(wanted)}
        return sorted(fleets, key=lambda f: order[f.name])
    return list(fleets.order_by("created", "name"))


def choose_fleet(run: Run) -> Fleet | None:
    demands = group_demands(run)
    multi_node = sum(n for _, n in demands) > 1
    for fleet in candidate_fleets(run):
        static = is_static(fleet)
        if multi_node and static and fleet.placement != "cluster":
            continue  # nodes of one run must reach each other on a private network
        if static and static_fleet_fits(fleet, demands):
            return fleet
        if not static and cloud_fleet_fits(fleet, demands):
            return fleet
    return None


def take_instance(job: Job, fleet: Fleet) -> Instance | None:
    """Claim one idle instance that fits the job (a conditional update: never two jobs on one)."""
    for inst in candidates(fleet, job.spec["resources"]):
        touched = Instance.objects.filter(pk=inst.pk, status=InstanceStatus.IDLE).update(
            status=InstanceStatus.BUSY, idle_since=None, updated=timezone.now())
        if touched == 1:
            return Instance.objects.get(pk=inst.pk)
    return None
