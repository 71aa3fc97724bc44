"""Which fleets can take a run now, and why none can: the placement reads, in one read-only module.

The plan (runs/services/submission.py: `muster apply` shows where a run would go, or why nowhere)
and the engine's placement (engine/submitted/placement.py takes the hosts; provision.py writes the
no-capacity failure) ask the same questions here, so a plan never says "fits" where placement
would fail, nor the other way round. Nothing here writes: taking hosts is the engine's.

Why a run does not fit (`explain`): for each group, the requirement no host met and how many hosts
met each part. Counts are over a fleet's live hosts (idle or busy); only idle, reachable ones can
take a job now.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from itertools import islice
from typing import Any

from django.conf import settings
from django.db.models import Count, Q

from backends.base import BackendError
from backends.registry import creates_groups, fleet_backend_config, get_compute
from instances.models import (
    Fleet,
    FleetBackend,
    FleetStatus,
    GroupKind,
    Instance,
    InstanceGroup,
    InstanceStatus,
    Placement,
)
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


def free_instances(fleet: Fleet, busy_too: bool = False):
    """The fleet's idle, reachable hosts; with `busy_too`, its busy ones as well (the hosts a run
    waiting for a full fleet will get once their jobs end)."""
    # Instance.objects, not fleet.instances: the related manager would set `fleet` on every row
    # and, with .only(), fetch each row's deferred fleet_id in a query of its own.
    statuses = [InstanceStatus.IDLE, InstanceStatus.BUSY] if busy_too else [InstanceStatus.IDLE]
    return Instance.objects.filter(
        Q(group__isnull=True) | Q(group__kind=GroupKind.CLUSTER), fleet=fleet, status__in=statuses, unreachable=False
    )


def page_for(wanted: int) -> int:
    # a little more than is wanted, for rows `fits` rejects or other workers take meanwhile
    return min(64, max(8, 2 * wanted))


@functools.cache
def _candidates_sql(statuses: int, tpu: bool, gpu: bool, after: bool) -> str:
    """free_instances narrowed by the indexed columns, one page in placement order, as written SQL:
    plans and placement ask it for every group, and the ORM spent more building and compiling the
    query than the database spent answering it. Loads only what placement uses of a host."""
    where = ["(i.group_id IS NULL OR g.kind = %s)", "i.fleet_id = %s", f"i.status IN ({', '.join(['%s'] * statuses)})",
             "i.unreachable = %s", "i.cpus >= %s", "i.memory_gb >= %s", "i.tpu <> %s" if tpu else "i.tpu = %s"]
    if gpu:
        where.append("i.gpu_count >= %s")
    if after:  # keyset paging from the last row of the page before
        where.append("(i.gpu_count > %s OR (i.gpu_count = %s AND i.id > %s))")
    return (f'SELECT i.id, i.name, i.resources, i.gpu_count, i.internal_ip FROM "{Instance._meta.db_table}" i '
            f'LEFT OUTER JOIN "{InstanceGroup._meta.db_table}" g ON g.id = i.group_id '
            f"WHERE {' AND '.join(where)} ORDER BY i.gpu_count, i.id LIMIT %s")


def candidates(fleet: Fleet, req: dict, page: int = 32, busy_too: bool = False):
    """Free instances that may fit `req` (free_instances' rows), a page at a time.

    Fewest GPUs first, so a job that does not ask for GPUs (a CPU router) lands on a CPU host
    and leaves the GPU hosts to the groups that need them.

    The indexed columns narrow the query (so its cost does not grow with the fleet); `fits` has
    the last word on each row (GPU names and memory, arch, disk).
    """
    statuses = [InstanceStatus.IDLE.value, InstanceStatus.BUSY.value] if busy_too else [InstanceStatus.IDLE.value]
    params = [GroupKind.CLUSTER.value, fleet.pk, *statuses, False, (req.get("cpu") or {}).get("min") or 0,
              (req.get("memory") or {}).get("min") or 0, ""]
    gpu = req.get("gpu")
    tpu = bool(gpu and gpu.get("tpu"))
    gpu_min = not tpu and bool(gpu)
    if gpu_min:
        params.append((gpu.get("count") or {}).get("min") or 0)
    after: list = []
    while True:
        # keyset paging: rows other workers claim meanwhile drop out without shifting the pages
        sql = _candidates_sql(len(statuses), tpu, gpu_min, bool(after))
        rows = list(Instance.objects.raw(sql, [*params, *after, page]))
        for inst in rows:
            if fits(req, inst.resources):
                yield inst
        if len(rows) < page:
            return
        last = rows[-1]
        after = [last.gpu_count, last.gpu_count, last.id]


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
    # written SQL, as candidates': a plan, a submit and every placement ask it
    where, params = ["project_id = %s", "status = %s"], [project_id, FleetStatus.ACTIVE.value]
    if not local:
        where.append("backend <> %s")
        params.append(FleetBackend.LOCAL.value)
    if wanted:
        where.append(f"name IN ({', '.join(['%s'] * len(wanted))})")
        params.extend(wanted)
    fleets = list(Fleet.objects.raw(f'SELECT * FROM "{Fleet._meta.db_table}" WHERE {" AND ".join(where)} '
                                    "ORDER BY created, name", params))
    if wanted:
        order = {name: i for i, name in enumerate(wanted)}
        return sorted(fleets, key=lambda f: order[f.name])
    return fleets


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
Part = tuple[str, Callable[[dict], bool]]
DOCKER = "Docker"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _gpu_label(gpu: dict) -> str:
    if gpu.get("tpu"):
        return f"tpu {gpu['tpu']}"
    count = (gpu.get("count") or {}).get("min") or 0
    words = ["/".join(gpu.get("names") or []) or (gpu.get("vendor") or "")]
    memory = gpu.get("memory") or {}
    if memory.get("min") is not None or memory.get("max") is not None:
        low = "" if memory.get("min") is None else f"{_number(memory['min'])}GB"
        high = "" if memory.get("max") is None else f"{_number(memory['max'])}GB"
        words.append(low if low == high else f"{low}..{high}")
    label = " ".join(w for w in ["gpu", *words] if w)
    return label if count <= 1 else f"{count} x {label}"


def parts_of(req: dict) -> list[Part]:
    """The separate requirements of a group, each with the test one host's resources must pass."""
    parts: list[Part] = []
    if req.get("docker"):
        parts.append((DOCKER, lambda r: bool(r.get("docker") or r.get("tpu"))))
    gpu = req.get("gpu")
    if gpu is not None:
        parts.append((_gpu_label(gpu), lambda r: fits({"gpu": gpu}, r)))
    else:
        parts.append(("no TPU", lambda r: fits({}, r)))
    cpu = req.get("cpu") or {}
    if cpu.get("arch"):
        parts.append((f"arch {cpu['arch']}", lambda r: fits({"cpu": {"arch": cpu["arch"]}}, r)))
    for key, label, unit in (("cpu", "cpu", ""), ("memory", "memory", "GB"), ("disk", "disk", "GB")):
        low = (req.get(key) or {}).get("min")
        if low:
            parts.append((f"{label} >= {_number(low)}{unit}", lambda r, key=key, low=low: fits({key: {"min": low}}, r)))
    return parts


# One kind of host of a fleet: its resources, whether such hosts are free now, and how many there are.
Shape = tuple[dict, bool, int]


def _hosts(fleet: Fleet) -> list[Shape]:
    """The fleet's live hosts by kind. A fleet's hosts are mostly alike, so grouping them in the
    read makes the explanation cost as many tests as there are kinds of host, not hosts (it ran
    every part's test on every host: 46 ms of a worker's CPU per failed run on 400 hosts)."""
    rows = Instance.objects.filter(fleet=fleet, status__in=[InstanceStatus.IDLE, InstanceStatus.BUSY]) \
        .values_list("resources", "status", "unreachable").annotate(n=Count("id")).order_by()
    shapes: dict[tuple[str, bool], Shape] = {}
    for res, status, unreachable, n in rows:
        free = status == InstanceStatus.IDLE and not unreachable
        key = (json.dumps(res or {}, sort_keys=True), free)
        shapes[key] = (res or {}, free, n + (shapes[key][2] if key in shapes else 0))
    return list(shapes.values())


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _static_reason(fleet: Fleet, hosts: list[Shape], parts: list[Part], need: int) -> str | None:
    """Why the fleet's hosts cannot hold this group alone, or None when they can."""
    count = lambda shapes: sum(n for _, _, n in shapes)  # noqa: E731
    if not hosts:
        return f"fleet {fleet.name} has no hosts"
    text = f"fleet {fleet.name} has {_plural(count(hosts), 'host')}"
    left = hosts
    for i, (label, test) in enumerate(parts):
        kept = [h for h in left if test(h[0])]
        if label == DOCKER and not kept:
            return f"fleet {fleet.name}: no host has Docker; install docker or remove image"
        if len(kept) == len(left) and (i > 0 or label == "no TPU"):
            continue  # a part every host left meets says nothing
        of_those = " of those" if i and count(left) != count(hosts) else ""
        text += f", {'none' if not kept else count(kept)}{of_those} with {label}"
        left = kept
        if not left:
            return text
    if count(left) < need:
        return f"{text}; the group needs {need}"
    free = sum(n for _, ok, n in left if ok)
    if free < need:
        return f"{text}, {free} of them idle and reachable now; the group needs {need}"
    return None


def _cloud_reason(fleet: Fleet, req: dict, needs: str) -> str | None:
    try:
        offers = get_compute(fleet.backend, fleet_backend_config(fleet)).get_offers(req)
    except BackendError as exc:
        return f"fleet {fleet.name} ({fleet.backend}) could not list offers: {exc}"
    return None if offers else f"fleet {fleet.name} ({fleet.backend}) has no offer for {needs}"


LOCAL_REFUSED = ("the project's fleets that the run may use are local fleets, which run only superusers' runs (a "
                 "local job is a shell on the control plane; an operator can open them to every member with "
                 "MUSTER_LOCAL_FLEET_MEMBERS=1): use an ssh or gcp fleet")


def explain(project_id: int, wanted: list[str], groups: list[Group], configuration: dict | None = None,
            local: bool = True) -> list[str]:
    """One line per group that no fleet can hold, else one per fleet saying what it lacks (with the
    run's `configuration`, a fleet whose container policy forbids the run says that)."""
    fleets = fleets_for(project_id, wanted, local=local)
    if not fleets and not local and fleets_for(project_id, wanted):
        return [LOCAL_REFUSED]
    if not fleets:
        if wanted:
            return [f"the project has no active fleet named {', '.join(wanted)} (the run's `fleets`)"]
        return ["the project has no active fleet: create one first"]
    total = sum(n for _, _, n in groups)
    written = (configuration or {}).get("groups") or []
    own = [list(written[g].get("fleets") or []) if g < len(written) else [] for g in range(len(groups))]
    fleet_reason: dict[int, str] = {}
    hosts: dict[int, list] = {}
    for fleet in fleets:
        refused = policy_refusals(fleet, configuration) if configuration is not None else []
        if refused:
            fleet_reason[fleet.pk] = "; ".join(refused)
        elif is_static(fleet):
            if total > 1 and fleet.placement != Placement.CLUSTER:
                fleet_reason[fleet.pk] = (f"fleet {fleet.name} has placement {fleet.placement}: the nodes of a "
                                          "multi-node run need a fleet with placement: cluster")
            else:
                hosts[fleet.pk] = _hosts(fleet)
    # group -> fleet -> why it cannot hold the group alone (None: it can)
    reasons: dict[int, dict[int, str | None]] = {}
    needs: dict[int, str] = {}
    for g, (_name, req, count) in enumerate(groups):
        parts = parts_of(req)
        # what the group asks for: its GPUs, and every other part that rules out some host
        shown = [label for i, (label, test) in enumerate(parts) if label != "no TPU" and (
            (i == 0 and req.get("gpu") is not None)
            or any(not test(res) for shapes in hosts.values() for res, _, _ in shapes))]
        needs[g] = f"{_plural(count, 'host')}" + (f" with {' and '.join(shown)}" if shown else "")
        reasons[g] = {}
        for fleet in fleets:
            if own[g] and fleet.name not in own[g]:
                reasons[g][fleet.pk] = f"fleet {fleet.name} is not in the group's `fleets` ({', '.join(own[g])})"
            elif fleet.pk in fleet_reason:
                reasons[g][fleet.pk] = fleet_reason[fleet.pk]
            elif fleet.pk in hosts:
                reasons[g][fleet.pk] = _static_reason(fleet, hosts[fleet.pk], parts, count)
            else:
                reasons[g][fleet.pk] = _cloud_reason(fleet, req, " and ".join(shown) or "it")
    lines = [f"{groups[g][0]}: needs {needs[g]}: " + "; ".join(r for r in reasons[g].values() if r)
             for g in range(len(groups)) if all(reasons[g].values())]
    if lines:
        return lines
    for fleet in fleets:  # every group fits somewhere on its own, but no fleet holds them all
        if fleet.pk in fleet_reason:
            lines.append(fleet_reason[fleet.pk])
            continue
        lacking = [groups[g][0] for g in range(len(groups)) if reasons[g][fleet.pk]]
        if lacking:
            held = [groups[g][0] for g in range(len(groups)) if not reasons[g][fleet.pk]]
            why = "; ".join(f"{groups[g][0]}: {reasons[g][fleet.pk]}" for g in range(len(groups))
                            if reasons[g][fleet.pk])
            lines.append(f"fleet {fleet.name} can hold {', '.join(held)} but not {', '.join(lacking)} ({why})")
        else:
            lines.append(f"fleet {fleet.name} can hold each group on its own but not all {total} nodes at once "
                         f"(a host takes one job): {_short_groups(fleet, hosts.get(fleet.pk) or [], groups)}")
    return lines


def _short_groups(fleet: Fleet, hosts: list[Shape], groups: list[Group]) -> str:
    """Which groups come up short when the run's groups take the idle hosts in the order the gang
    take uses (GPU groups first): the part of the run that waits."""
    idle = [n if free else 0 for _, free, n in hosts]  # idle hosts of each kind not taken yet
    short = []
    for name, req, count in sorted(groups, key=lambda g: not (g[1].get("gpu") or {})):
        tests = [test for _, test in parts_of(req)]
        kinds = [i for i, (res, _, _) in enumerate(hosts) if idle[i] and all(t(res) for t in tests)]
        found = sum(idle[i] for i in kinds)
        wanted = count
        for i in kinds:
            took = min(wanted, idle[i])
            idle[i] -= took
            wanted -= took
        if found < count:
            short.append(f"{name} is {count - found} short (needs {count}, {found} idle left)")
    return "; ".join(short) or f"fleet {fleet.name}'s idle hosts change meanwhile"


def groups_of(jobs: list[Any], name: Callable, index: Callable, resources: Callable) -> list[Group]:
    """(name, requirements, node count) per group, in group order, from job rows or job specs."""
    found: dict[int, list] = {}
    for job in jobs:
        entry = found.setdefault(index(job), [name(job), resources(job), 0])
        entry[2] += 1
    return [tuple(found[k]) for k in sorted(found)]
