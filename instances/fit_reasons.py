"""Why a run fits nowhere now: for each group, the requirement no host met and how many hosts met
each part (the plan's `reasons` and the engine's no-capacity failure say the same words).

Counts are over a fleet's live hosts (idle or busy); only idle, reachable ones can take a job now.
A fleet's hosts are read by kind (resources, free now) with a count, so the words cost as many
tests as there are kinds of host, not hosts.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from django.db.models import Count

from backends.base import BackendError
from backends.registry import fleet_backend_config, get_compute
from instances.fitting import LOCAL_REFUSED, Group, fleets_for, is_static, policy_refusals, run_backends
from instances.models import Fleet, Instance, InstanceStatus, Placement
from runs.configuration import fits

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


def _static_reason(fleet: Fleet, hosts: list[Shape], parts: list[Part], need: int, field: str = "nodes") -> str | None:
    """Why the fleet's hosts cannot hold this group alone, or None when they can, with the fix in the
    real figures (`field`: where the group's node count is written)."""
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
    have = count(left)
    if have < need:
        such = " like those" if have != count(hosts) else ""
        return f"{text}: lower {field} to {have} or add {_plural(need - have, 'host')}{such} to fleet {fleet.name}"
    free = sum(n for _, ok, n in left if ok)
    if free < need:
        wait = "let it wait for busy hosts (retry: {on_events: [no-capacity]})"
        return f"{text}, {free} of them idle and reachable now: " + (
            f"lower {field} to {free} or {wait}" if free else wait)
    return None


def _cloud_reason(fleet: Fleet, req: dict, needs: str) -> str | None:
    try:
        offers = get_compute(fleet.backend, fleet_backend_config(fleet)).get_offers(req)
    except BackendError as exc:
        return f"fleet {fleet.name} ({fleet.backend}) could not list offers: {exc}"
    return None if offers else f"fleet {fleet.name} ({fleet.backend}) has no offer for {needs}"


def explain(project_id: int, wanted: list[str], groups: list[Group], configuration: dict | None = None,
            local: bool = True, fleets: list[Fleet] | None = None) -> list[str]:
    """One line per group that no fleet can hold, else one per fleet saying what it lacks (with the
    run's `configuration`, a fleet whose container policy forbids the run says that). `fleets`:
    fleets_for(project_id, wanted, local) as the caller already read it."""
    backends = run_backends(configuration)
    if fleets is None:
        fleets = fleets_for(project_id, wanted, local=local, backends=backends)
    if not fleets and not local and fleets_for(project_id, wanted, backends=backends):
        return [LOCAL_REFUSED]
    if not fleets and backends is not None and fleets_for(project_id, wanted, local=local):
        return [f"the project has no active fleet of the run's `backends` ({', '.join(backends)}): "
                "remove `backends`, or name the kinds of its fleets"]
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
                field = "nodes" if len(groups) == 1 else f"the nodes of group {groups[g][0]}"
                reasons[g][fleet.pk] = _static_reason(fleet, hosts[fleet.pk], parts, count, field)
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
