"""Where a run goes: the fleet that can hold every group, and the instance each job takes."""

from __future__ import annotations

from itertools import islice

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from backends.registry import creates_groups, fleet_backend_config, get_compute
from instances.models import Fleet, FleetBackend, FleetStatus, GroupKind, Instance, InstanceStatus, Placement
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


def free_instances(fleet: Fleet):
    # Instance.objects, not fleet.instances: the related manager would set `fleet` on every row
    # and, with .only(), fetch each row's deferred fleet_id in a query of its own.
    return Instance.objects.filter(
        Q(group__isnull=True) | Q(group__kind=GroupKind.CLUSTER), fleet=fleet, status=InstanceStatus.IDLE, unreachable=False
    )


def page_for(wanted: int) -> int:
    # a little more than is wanted, for rows `fits` rejects or other workers take meanwhile
    return min(64, max(8, 2 * wanted))


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
    qs = qs.order_by("gpu_count", "id").only("id", "name", "resources", "gpu_count", "internal_ip")
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
    pools = [list(islice(candidates(fleet, req, page_for(total)), total)) for req, _ in demands]
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


def local_allowed(user) -> bool:
    """Whether `user`'s runs may go to local fleets. A local job is a shell on the control plane as
    the server's user (its database, keys and every token), so: superusers' runs, and every
    writer's only where the operator opened them with MUSTER_LOCAL_FLEET_MEMBERS=1."""
    return bool(settings.MUSTER["LOCAL_FLEET_MEMBERS"]) or bool(user is not None and user.is_superuser)


def candidate_fleets(run: Run):
    return allowing_fleets(fleets_for(run.project_id, run.configuration.get("fleets") or [],
                                      local=local_allowed(run.user)), run.configuration)


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


def fleets_for(project_id: int, wanted: list[str], local: bool = True) -> list[Fleet]:
    """The project's active fleets a run may use: those it names in `fleets:` in that order, else all;
    local fleets only with `local` (local_allowed of the run's user)."""
    fleets = Fleet.objects.filter(project_id=project_id, status=FleetStatus.ACTIVE)
    if not local:
        fleets = fleets.exclude(backend=FleetBackend.LOCAL)
    if wanted:
        fleets = fleets.filter(name__in=wanted)
        order = {name: i for i, name in enumerate(wanted)}
        return sorted(fleets, key=lambda f: order[f.name])
    return list(fleets.order_by("created", "name"))


def first_fitting_fleet(fleets: list[Fleet], demands: list[tuple[dict, int]]) -> Fleet | None:
    multi_node = sum(n for _, n in demands) > 1
    for fleet in fleets:
        static = is_static(fleet)
        if multi_node and static and fleet.placement != Placement.CLUSTER:
            continue  # nodes of one run must reach each other on a private network
        if static and static_fleet_fits(fleet, demands):
            return fleet
        if not static and cloud_fleet_fits(fleet, demands):
            return fleet
    return None


def take_instances(fleet: Fleet, req: dict, count: int) -> list[Instance]:
    """Claim `count` idle instances that fit `req` in one transaction, or none at all.

    A group master takes its whole group this way, so a run never holds part of a group while it
    waits for the rest. The scan is not locked (rows another worker rejects stay visible to us);
    only the picks are, with SKIP LOCKED on PostgreSQL, so concurrent takers skip each other's
    picks and look further instead of waiting. SQLite's IMMEDIATE transaction serialises takers.
    """
    now = timezone.now()
    skip_locked = connection.features.has_select_for_update_skip_locked
    taken: list[Instance] = []
    with transaction.atomic():
        found = candidates(fleet, req, page_for(count))
        while len(taken) < count:
            chunk = {inst.pk: inst for inst in islice(found, count - len(taken))}
            if not chunk:
                transaction.set_rollback(True)  # short of the whole group: give back what we took
                return []
            if skip_locked:  # the picks still idle that nobody else is taking right now
                locked = set(Instance.objects.filter(pk__in=chunk, status=InstanceStatus.IDLE)
                             .select_for_update(skip_locked=True).values_list("pk", flat=True))
                chunk = {pk: inst for pk, inst in chunk.items() if pk in locked}
            touched = Instance.objects.filter(pk__in=chunk, status=InstanceStatus.IDLE).update(
                status=InstanceStatus.BUSY, idle_since=None, updated=now)
            if touched != len(chunk):  # cannot happen with the picks locked; never guess which rows we got
                transaction.set_rollback(True)
                return []
            taken.extend(chunk.values())
    for inst in taken:  # rows as `candidates` loaded them (name, address, resources), now busy
        inst.status, inst.idle_since = InstanceStatus.BUSY, None
    return taken


GangGroup = tuple[int, str, dict, int]  # (group index, name, requirements, node count)


def take_gang(fleet: Fleet, groups: list[GangGroup]) -> tuple[dict[int, list[Instance]], list[str]]:
    """take_gang_across with every group on one fleet."""
    return take_gang_across([(fleet, g) for g in groups])


def take_gang_across(groups: list[tuple[Fleet, GangGroup]]) -> tuple[dict[int, list[Instance]], list[str]]:
    """Take hosts for every static group of a run in one transaction, or none at all; the groups
    may be on different fleets (a run that spans fleets).

    Returns ({group index: instances}, []) or ({}, one line per group that came up short).
    Gang takers lock the rows of the fleets they take from first, always in the order of their
    ids, so two runs racing for the same hosts go one after the other: the first takes all it
    needs, the second sees what is left. Neither can hold part of the hosts while waiting for the
    rest, and with the locks taken in one order there is no deadlock. FOR NO KEY UPDATE: a
    transaction placing a run on the fleet holds a KEY SHARE on its row (the run's foreign key),
    which this lock need not wait for. Groups that ask for GPUs go first, so a CPU group never
    takes the GPU host a later group needed.
    """
    order = sorted(groups, key=lambda fg: (not (fg[1][2].get("gpu") or {}), fg[1][0]))
    taken: dict[int, list[Instance]] = {}
    short: list[str] = []
    with transaction.atomic():
        list(Fleet.objects.select_for_update(no_key=True).filter(pk__in={f.pk for f, _ in groups})
             .order_by("pk").values_list("pk", flat=True))
        for fleet, (index, name, req, count) in order:
            got = take_instances(fleet, req, count)
            if got:
                taken[index] = got
                continue
            left = sum(1 for _ in islice(candidates(fleet, req, page_for(count)), count))
            before = [g[1] for f, g in order if g[0] in taken and f.pk == fleet.pk]
            after = f" once {', '.join(before)} took theirs" if before else ""
            short.append(f"{name}: needs {count} idle hosts of fleet {fleet.name}, {left} left{after}")
        if short:
            transaction.set_rollback(True)  # nothing of the run stays taken
            return {}, short
    return taken, []


def take_instance(job: Job, fleet: Fleet) -> Instance | None:
    """Claim one idle instance that fits the job (never two jobs on one)."""
    picked = take_instances(fleet, job.spec["resources"], 1)
    return picked[0] if picked else None
