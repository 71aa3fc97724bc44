"""Plain-text rendering for the `muster` CLI: aligned tables and one-line summaries of API rows.

Everything here takes the JSON the REST API returns and gives back strings, so it can be read
(and tested) without a server.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from cli.service_render import service_text

# A command longer than this is cut in the plan table: the table is a summary, not the config.
COMMAND_WIDTH = 60
# The defaults a resources block gets when it says nothing (runs/configuration/resources.py); showing
# them on every row would hide what the user actually asked for.
_DEFAULT_DISK_GB = 1.0


def table(headers: Sequence[str], rows: Iterable[Sequence[object]], indent: str = "") -> str:
    cells = [[_cell(value) for value in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    lines = [_line([h.upper() for h in headers], widths), *(_line(row, widths) for row in cells)]
    return "\n".join(indent + line for line in lines)


def _line(cells: Sequence[str], widths: Sequence[int]) -> str:
    return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()


def _cell(value: object) -> str:
    return "-" if value is None or value == "" else str(value)


def status_counts(rows: Iterable[dict[str, Any]]) -> str:
    """`2 running, 1 provisioning`: statuses in the order they first appear (job order)."""
    counts = Counter(row.get("status") or "unknown" for row in rows)
    return ", ".join(f"{n} {status}" for status, n in counts.items()) or "-"


def age(timestamp: str | None, now: datetime | None = None) -> str:
    if not timestamp:
        return "-"
    try:
        then = datetime.fromisoformat(timestamp)
    except ValueError:
        return timestamp
    if then.tzinfo is None:
        then = then.replace(tzinfo=UTC)
    seconds = int(((now or datetime.now(UTC)) - then).total_seconds())
    if seconds < 60:
        return "just now"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit} ago"
    return "just now"


# ---- resources ----------------------------------------------------------------------------------


def _number(value: float | int) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _range(spec: dict[str, Any] | None, unit: str = "") -> str | None:
    """{min, max} -> `4`, `2..8`, `16GB..`, `..8`; None when there is no bound at all."""
    if not spec:
        return None
    low, high = spec.get("min"), spec.get("max")
    if low is None and high is None:
        return None
    if low == high:
        return f"{_number(low)}{unit}"
    left = "" if low is None else f"{_number(low)}{unit}"
    right = "" if high is None else f"{_number(high)}{unit}"
    return f"{left}..{right}"


def _gpu_request(gpu: dict[str, Any]) -> str:
    if gpu.get("tpu"):
        return f"tpu {gpu['tpu']}"
    parts = ["/".join(gpu.get("names") or []) or gpu.get("vendor") or "any"]
    memory = _range(gpu.get("memory"), "GB")
    if memory:
        parts.append(memory)
    parts.append(_range(gpu.get("count")) or "1")
    return "gpu " + ":".join(parts)


def job_resources(res: dict[str, Any] | None) -> str:
    """A job's requested resources (the normalized form of runs.configuration) in one short line."""
    if not res:
        return "-"
    parts = []
    cpu = res.get("cpu") or {}
    cpu_range = _range(cpu)
    if cpu_range:
        parts.append(f"cpu {cpu_range}" + (" arm" if cpu.get("arch") == "arm" else ""))
    memory = _range(res.get("memory"), "GB")
    if memory:
        parts.append(f"mem {memory}")
    disk = res.get("disk") or {}
    if disk.get("min") not in (None, _DEFAULT_DISK_GB) or disk.get("max") is not None:
        parts.append(f"disk {_range(disk, 'GB')}")
    if res.get("gpu"):
        parts.append(_gpu_request(res["gpu"]))
    return ", ".join(parts) or "-"


def instance_resources(res: dict[str, Any] | None) -> str:
    """What a host offers (the dict backends report: cpus, memory_gb, gpus, tpu...) in one line."""
    if not res:
        return "-"
    parts = []
    if res.get("cpus"):
        parts.append(f"{res['cpus']} cpu")
    if res.get("memory_gb"):
        parts.append(f"{_number(res['memory_gb'])}GB")
    gpus = res.get("gpus") or []
    if gpus:
        first = gpus[0]
        memory = f" {_number(first['memory_gb'])}GB" if first.get("memory_gb") else ""
        parts.append(f"{len(gpus)}x{first.get('name') or first.get('vendor') or 'gpu'}{memory}")
    if res.get("tpu"):
        chips = f" ({res['tpu_chips']} chips)" if res.get("tpu_chips") else ""
        parts.append(f"tpu {res['tpu']}{chips}")
    return ", ".join(parts) or "-"


# ---- the tables of each command ---------------------------------------------------------------


def first_command(commands: Sequence[str] | None) -> str:
    if not commands:
        return "-"
    lines = commands[0].strip().splitlines()
    line = lines[0] if lines else ""
    if len(line) > COMMAND_WIDTH:
        line = line[: COMMAND_WIDTH - 3] + "..."
    more = len(commands) - 1
    return f"{line} (+{more} more)" if more else line


def plan_table(jobs: Sequence[dict[str, Any]], groups: Sequence[dict[str, Any]] | None = None) -> str:
    """One row per group (the plan states what a group's nodes run once, in configuration.groups);
    one row per job for a server that sends each job's commands with the job."""
    if groups:
        nums: dict[int, list[int]] = {}
        for j in jobs:
            nums.setdefault(j.get("node_group_index"), []).append(j.get("job_num"))
        rows = []
        for g in groups:
            mine = nums.get(g.get("index")) or []
            span = "-" if not mine else str(mine[0]) if len(mine) == 1 else f"{mine[0]}-{mine[-1]}"
            rows.append((span, g.get("name"), _nodes(len(mine), g.get("slices") or 1), job_resources(g.get("resources")),
                         first_command(g.get("commands"))))
        return table(["jobs", "group", "nodes", "resources", "command"], rows)
    rows = [
        (j.get("job_num"), j.get("node_group_name"), j.get("node_group_rank"), job_resources(j.get("resources")),
         first_command(j.get("commands")))
        for j in jobs
    ]
    return table(["job", "group", "rank", "resources", "command"], rows)


def _nodes(count: int, slices: int) -> str:
    """A multislice group's nodes as slices x hosts per slice (the layout its ranks follow)."""
    return f"{count} ({slices} slices x {count // slices} hosts)" if slices > 1 else str(count)


def no_capacity(reasons: Sequence[str]) -> str:
    return "No fleet can hold this run now:\n" + "\n".join(f"  {line}" for line in reasons)


def would_wait(waits_for: str, place: int | None = None) -> str:
    queued = f", number {place} in the project's queue" if place else ""
    return f"Submitted, the run waits for {waits_for} (its retry lists no-capacity){queued}, holding no host."


def plan_warnings(warnings: Sequence[dict[str, Any]]) -> str:
    """What the configuration asks for that does not take effect on this server."""
    lines = [f"Warnings ({len(warnings)}): these keys are accepted but do not take effect as written"]
    lines += [f"  ! {w.get('message') or w.get('field')}" for w in warnings]
    return "\n".join(lines)


def clock(timestamp: str | None) -> str:
    """An API time as the server's UTC to the minute: `2026-12-06 05:12 UTC`."""
    try:
        then = datetime.fromisoformat(timestamp or "")
    except ValueError:
        return timestamp or "-"
    then = then.replace(tzinfo=UTC) if then.tzinfo is None else then.astimezone(UTC)
    return then.strftime("%Y-%m-%d %H:%M UTC")


def run_state(run: dict[str, Any]) -> tuple[str, str]:
    """(status, reason) as `ps` shows them: a run waiting for a free host reads `waiting`, with the
    time it gives up in place of a reason."""
    if run.get("waiting_for"):
        until = f"gives up at {clock(run['gives_up_at'])}" if run.get("gives_up_at") else "waits as long as it takes"
        place = f"#{run['queue_position']} (priority {run.get('priority')}) " if run.get("queue_position") else ""
        return "waiting", f"{place}{run['waiting_for']}; {until}"
    return run.get("status"), run.get("termination_reason")


def requested(jobs: Iterable[dict[str, Any]], key: str, unit: str = "") -> str:
    """What all the run's nodes ask for of `cpu` or `memory` (GB): `8`, or `8+` when more may be given."""
    total, more = 0.0, False
    for job in jobs:
        wanted = (job.get("resources") or {}).get(key) or {}
        total += wanted.get("min") or 0
        more = more or wanted.get("max") != wanted.get("min")
    return f"{_number(total)}{unit}{'+' if more else ''}" if total else "-"


def runs_table(runs: Sequence[dict[str, Any]], now: datetime | None = None) -> str:
    rows = [
        (r.get("name"), *run_state(r), r.get("fleet"), status_counts(r.get("jobs") or []),
         requested(r.get("jobs") or [], "cpu"), requested(r.get("jobs") or [], "memory", "GB"),
         age(r.get("submitted_at"), now))
        for r in runs
    ]
    headers = ["name", "status", "reason", "fleet", "jobs", "cpu", "memory", "submitted"]
    if any(r.get("service") for r in runs):  # services: where they are served, and replicas ready
        rows = [(*row, service_text(r)) for row, r in zip(rows, runs, strict=True)]
        headers.append("service")
    if any(j.get("deadline") for r in runs for j in r.get("jobs") or []):
        # flex-start slices: when Google takes them back (the run ends as an interruption then)
        rows = [(*row, deadline_text(r)) for row, r in zip(rows, runs, strict=True)]
        headers.append("deadline")
    return table(headers, rows)


def deadline_text(run: dict[str, Any]) -> str:
    deadlines = sorted(j["deadline"] for j in run.get("jobs") or [] if j.get("deadline"))
    return f"flex-start ends {clock(deadlines[0])}" if deadlines else "-"


def instances_summary(fleet: dict[str, Any]) -> str:
    instances = fleet.get("instances") or []
    if not instances:
        return "0"
    return f"{len(instances)} ({status_counts(instances)})"


def fleet_summary(fleet: dict[str, Any]) -> str:
    head = (f"fleet {fleet.get('name')}: {fleet.get('status')}, backend {fleet.get('backend')}, "
            f"placement {fleet.get('placement')}")
    instances = fleet.get("instances") or []
    if not instances:
        return head
    rows = [(i.get("name"), i.get("status"), i.get("internal_ip")) for i in instances]
    return head + "\n" + table(["name", "status", "ip"], rows, indent="  ")


_HOST_HEADERS = ["index", "name", "status", "health", "backend", "ip", "resources", "job"]


def health(inst: dict[str, Any]) -> str | None:
    # An idle host the server cannot reach gets no job: `idle` alone would say it is ready.
    if "unreachable" not in inst:
        return None
    return "unreachable" if inst["unreachable"] else "ok"


def _host_row(inst: dict[str, Any], docker: bool = False) -> tuple:
    row = (inst.get("index"), inst.get("name"), inst.get("status"), health(inst), inst.get("backend"),
           inst.get("internal_ip"), instance_resources(inst.get("resources")), inst.get("job"))
    return row + (docker_text(inst),) if docker else row


def docker_text(inst: dict[str, Any]) -> str:
    # whether the host can run jobs with `image`: the daemon's version, or "no"
    found = (inst.get("resources") or {}).get("docker")
    return f"{found.get('version')}" if isinstance(found, dict) and found.get("version") else "no"


def _knows_docker(instances: Sequence[dict[str, Any]]) -> bool:
    # hosts registered before the Docker probe carry no such fact: no column rather than a wrong "no"
    return any("docker" in (i.get("resources") or {}) for i in instances)


def _by_index(inst: dict[str, Any]) -> tuple:
    # TPU worker ids order a pod's hosts; an instance without one goes last, by name.
    index = inst.get("index")
    return (index is None, index if index is not None else 0, inst.get("name") or "")


def _group_header(name: str, members: Sequence[dict[str, Any]], shapes: dict[str, str],
                  queued: dict[str, dict[str, Any]] | None = None) -> str:
    kind = members[0].get("group_kind") or "group"
    shape = shapes.get(name) or (members[0].get("resources") or {}).get("tpu")
    label = "pod" if kind == "tpu_pod" else "group"
    details = f"{kind}, {shape}" if shape else kind
    fleet = members[0].get("fleet")
    header = f"{label} {name} ({details})" + (f" in fleet {fleet}" if fleet else "")
    request = (queued or {}).get(name)
    if request:
        header += f"\n  queued resource {request.get('name') or name} in {request.get('zone') or '?'}: " \
                  f"{request.get('state') or 'requested'}"
    return header


def instances_tree(instances: Sequence[dict[str, Any]], groups: Sequence[dict[str, Any]] = ()) -> str:
    """Hosts under their instance group (a TPU pod by worker index), then ungrouped hosts by fleet."""
    shapes = {g["name"]: (f"{g['slices']} x {g['shape']}" if (g.get("slices") or 1) > 1 else g.get("shape"))
              for g in groups if g.get("name") and g.get("shape")}
    queued = {g["name"]: g["queued_resource"] for g in groups if g.get("name") and g.get("queued_resource")}
    grouped: dict[str, list[dict[str, Any]]] = {}
    loose: dict[str, list[dict[str, Any]]] = {}
    for inst in instances:
        if inst.get("group"):
            grouped.setdefault(inst["group"], []).append(inst)
        else:
            loose.setdefault(inst.get("fleet") or "(no fleet)", []).append(inst)
    blocks = []
    docker = _knows_docker(instances)
    headers = _HOST_HEADERS + ["docker"] if docker else _HOST_HEADERS
    for name in sorted(grouped):
        members = sorted(grouped[name], key=_by_index)
        blocks.append(_group_header(name, members, shapes, queued) + "\n"
                      + table(headers, [_host_row(i, docker) for i in members], indent="  "))
    for fleet in sorted(loose):
        members = sorted(loose[fleet], key=lambda i: i.get("name") or "")
        rows = [_host_row(i, docker)[1:] for i in members]
        blocks.append(f"fleet {fleet}\n" + table(headers[1:], rows, indent="  "))
    return "\n\n".join(blocks)


# ---- jobs, events, plan placement -----------------------------------------------------------


def jobs_summary(jobs: Sequence[dict[str, Any]]) -> str:
    """The per-job table `apply` ends with."""
    rows = [(j.get("job_num"), j.get("node_group_name"), j.get("node_group_rank"), j.get("status"),
             j.get("termination_reason"), j.get("exit_status"), j.get("instance")) for j in jobs]
    return table(["job", "group", "rank", "status", "reason", "exit", "host"], rows)


def jobs_table(runs: Sequence[dict[str, Any]]) -> str:
    """`ps -v`: one row per job of each run, with the restarts of its group so far."""
    rows = []
    for r in runs:
        restarts = {e.get("group"): e.get("restarts", 0) for e in r.get("restarts") or []}
        rows += [(r.get("name"), j.get("job_num"), j.get("node_group_name"),
                  f"replica {j.get('replica_num', 0)}" if r.get("service") else j.get("node_group_rank"),
                  j.get("instance"), j.get("instance_ip"), j.get("status"), restarts.get(j.get("node_group_name"), 0),
                  ready_text(j), j.get("termination_reason"))
                 for j in (r.get("jobs") or [])]
    return table(["run", "job", "group", "rank", "host", "ip", "status", "restarts", "ready", "reason"], rows)


def ready_text(job: dict[str, Any]) -> str:
    """`yes` once ready; a running job's probes (passes in a row / needed, and the last error) until
    then; what a starting job waits for."""
    if job.get("ready_at"):
        return "yes"
    if job.get("waiting_for"):
        return f"waits for {job['waiting_for']}"
    probes = [p for p in job.get("probes") or [] if isinstance(p, dict)]
    if not probes:
        return ""
    parts = [f"{p.get('probe')} {p.get('success_streak', 0)}/{p.get('ready_after', 1)}"
             + (f" ({p['last_error']})" if p.get("last_error") else "") for p in probes]
    return "no: " + "; ".join(parts)


def events_table(events: Sequence[dict[str, Any]]) -> str:
    # to the second, in the server's UTC: the order and the gaps are what a reader looks for
    rows = [((e.get("created") or "")[:19].replace("T", " "), e.get("subject"), e.get("status"), e.get("actor"), e.get("message"))
            for e in events]
    return table(["time", "subject", "status", "actor", "message"], rows)


def plan_placement(capacity: dict[str, Any]) -> str:
    """Where a run would go now: the fleet (each group's, when the run spans fleets), and the idle
    hosts that fit each group."""
    fleets = capacity.get("fleets") or {}
    spans = len(set(fleets.values())) > 1
    lines = [f"Fits fleets {', '.join(dict.fromkeys(fleets.values()))} now (the run spans fleets)." if spans
             else f"Fits fleet {capacity.get('fleet')} now."]
    for group, hosts in (capacity.get("hosts") or {}).items():
        where = f" (fleet {fleets[group]})" if spans and group in fleets else ""
        lines.append(f"  {group}{where}: {', '.join(hosts) if hosts else 'new hosts (the fleet creates them)'}")
    return "\n".join(lines)
