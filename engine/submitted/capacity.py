"""Why a run does not fit: for each group, the requirement no host met and how many hosts met each part.

Used by the plan (so a user sees it before submitting) and by the no-capacity failure of a run.
Counts are over a fleet's live hosts (idle or busy); only idle, reachable ones can take a job now.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from backends.base import BackendError
from backends.registry import fleet_backend_config, get_compute
from engine.submitted import placement
from engine.tuning import NO_CAPACITY_MESSAGE_LIMIT
from instances.models import Fleet, Instance, InstanceStatus, Placement
from runs.configuration import fits

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


def _hosts(fleet: Fleet) -> list[tuple[dict, bool]]:
    """(resources, free now) of the fleet's live hosts."""
    rows = Instance.objects.filter(fleet=fleet, status__in=[InstanceStatus.IDLE, InstanceStatus.BUSY]) \
        .values_list("resources", "status", "unreachable")
    return [(res or {}, status == InstanceStatus.IDLE and not unreachable) for res, status, unreachable in rows]


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _static_reason(fleet: Fleet, hosts: list[tuple[dict, bool]], parts: list[Part], need: int) -> str | None:
    """Why the fleet's hosts cannot hold this group alone, or None when they can."""
    if not hosts:
        return f"fleet {fleet.name} has no hosts"
    text = f"fleet {fleet.name} has {_plural(len(hosts), 'host')}"
    left = hosts
    for i, (label, test) in enumerate(parts):
        kept = [h for h in left if test(h[0])]
        if label == DOCKER and not kept:
            return f"fleet {fleet.name}: no host has Docker; install docker or remove image"
        if len(kept) == len(left) and (i > 0 or label == "no TPU"):
            continue  # a part every host left meets says nothing
        of_those = " of those" if i and len(left) != len(hosts) else ""
        text += f", {'none' if not kept else len(kept)}{of_those} with {label}"
        left = kept
        if not left:
            return text
    if len(left) < need:
        return f"{text}; the group needs {need}"
    free = sum(1 for _, ok in left if ok)
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
    fleets = placement.fleets_for(project_id, wanted, local=local)
    if not fleets and not local and placement.fleets_for(project_id, wanted):
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
        refused = placement.policy_refusals(fleet, configuration) if configuration is not None else []
        if refused:
            fleet_reason[fleet.pk] = "; ".join(refused)
        elif placement.is_static(fleet):
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
            or any(not test(res) for rows in hosts.values() for res, _ in rows))]
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


def _short_groups(fleet: Fleet, hosts: list[tuple[dict, bool]], groups: list[Group]) -> str:
    """Which groups come up short when the run's groups take the idle hosts in the order the gang
    take uses (GPU groups first): the part of the run that waits."""
    used: set[int] = set()
    short = []
    for name, req, count in sorted(groups, key=lambda g: not (g[1].get("gpu") or {})):
        tests = [test for _, test in parts_of(req)]
        fit = [i for i, (res, free) in enumerate(hosts) if free and i not in used and all(t(res) for t in tests)]
        used.update(fit[:count])
        if len(fit) < count:
            short.append(f"{name} is {count - len(fit)} short (needs {count}, {len(fit)} idle left)")
    return "; ".join(short) or f"fleet {fleet.name}'s idle hosts change meanwhile"


def groups_of(jobs: list[Any], name: Callable, index: Callable, resources: Callable) -> list[Group]:
    """(name, requirements, node count) per group, in group order, from job rows or job specs."""
    found: dict[int, list] = {}
    for job in jobs:
        entry = found.setdefault(index(job), [name(job), resources(job), 0])
        entry[2] += 1
    return [tuple(found[k]) for k in sorted(found)]


def no_capacity_message(lines: list[str]) -> str:
    text = "no fleet can hold every group of this run: " + " | ".join(lines)
    return text if len(text) <= NO_CAPACITY_MESSAGE_LIMIT else text[:NO_CAPACITY_MESSAGE_LIMIT - 3] + "..."
