"""The run's picture: an SVG drawn on the server from the jobs and their hosts.

Groups are boxes in rank order, one SVG each; each group's nodes sit in rows of up to PER_ROW inside it. Nodes
on the hosts of one TPU pod slice are drawn inside one pod box, so the slice reads as one machine.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.utils import timezone
from django.utils.html import escape

from console import words
from instances.models import GroupKind
from runs.choices import JobStatus

# colour per status, chosen for contrast against white text (WCAG AA at 12px bold); the word is
# always printed beside the colour so nobody needs to tell colours apart
STATUS_COLOURS = {
    JobStatus.SUBMITTED: "#5a6270", JobStatus.PROVISIONING: "#7a5b00", JobStatus.PULLING: "#7a5b00",
    JobStatus.RUNNING: "#0b5cad", JobStatus.TERMINATING: "#8a4b00", JobStatus.TERMINATED: "#4a4a4a",
    JobStatus.ABORTED: "#8b1a1a", JobStatus.FAILED: "#b00020", JobStatus.DONE: "#1d6b2f",
}
NODE_W, NODE_H, GAP, PAD, HEAD = 220, 120, 12, 14, 50
PER_ROW = 4


def start_step(order: str, job_num: int) -> str:
    """When a node starts, as the engine enforces it (engine/starting/ordering.py)."""
    if order == "workers-first":
        return "starts 2nd (after the workers)" if job_num == 0 else "starts 1st"
    if order == "master-first":
        return "starts 1st (master)" if job_num == 0 else "starts 2nd (after the master)"
    return "starts with the others"


@dataclass
class _Box:
    label: str
    jobs: list = field(default_factory=list)


def _gpu_text(job) -> str:
    inst = job.instance
    if inst is not None:
        gpus = (inst.resources or {}).get("gpus") or []
        if gpus:
            names = sorted({g.get("name", "?") for g in gpus})
            return f"GPU {len(gpus)}x {'/'.join(names)}"
        if inst.tpu:
            return f"TPU {inst.tpu}"
    wanted = ((job.spec or {}).get("resources") or {}).get("gpu")
    return f"GPU wanted: {wanted}" if wanted else "no GPU"


# a status line holds this many characters of 12px bold at NODE_W: longer words wrap onto more lines
STATUS_CHARS = 30
LINE_H = 15


def status_lines(text: str, width: int = STATUS_CHARS) -> list[str]:
    """The status and reason in lines of at most `width` characters, broken at a space, else after
    a `_`, else inside the word: every character is drawn, at any length."""
    lines: list[str] = []
    rest = text
    while len(rest) > width:
        space, underscore = rest.rfind(" ", 1, width + 1), rest.rfind("_", 1, width)
        cut = space if space > 0 else (underscore + 1 if underscore > 0 else width)
        lines.append(rest[:cut].rstrip())
        rest = rest[cut:].lstrip()
    return [*lines, rest] if rest or not lines else lines


def status_text(job) -> str:
    if job.termination_reason:
        return f"{job.status} ({job.termination_reason})"
    if job.status == JobStatus.RUNNING:
        # ready: every probe of its group passed (or it has none); until then the probes' streaks
        return f"{job.status}, {'ready' if job.ready_at else 'not ready yet'}"
    if job.waiting_for and job.status in (JobStatus.SUBMITTED, JobStatus.PROVISIONING, JobStatus.PULLING):
        return f"{job.status}: waiting for {job.waiting_for}"
    return job.status


def _node(job, x: int, y: int, lines: int, now) -> list[str]:
    colour = STATUS_COLOURS.get(job.status, "#5a6270")
    inst = job.instance
    host = inst.name if inst else "no host yet"
    ip = (inst.internal_ip or inst.hostname) if inst else "-"
    rank = f"rank {job.node_group_rank} · global {job.job_num}{' · master' if job.job_num == 0 else ''}"
    status = status_text(job)
    wrapped = status_lines(status)
    band = lines * LINE_H + 6
    spans = "".join(f'<tspan x="{x + 14}" dy="{0 if i == 0 else LINE_H}">{escape(line)}</tspan>'
                    for i, line in enumerate(wrapped))
    return [
        f'<g class="node" data-job="{job.job_num}" data-status="{escape(job.status)}">',
        f'<title>job {job.job_num}: {escape(status)}</title>',
        f'<rect x="{x}" y="{y}" width="{NODE_W}" height="{node_h(lines)}" rx="6" fill="#ffffff" '
        f'stroke="{colour}" stroke-width="2"/>',
        f'<text x="{x + 8}" y="{y + 18}" class="rank">{escape(rank)}</text>',
        f'<text x="{x + 8}" y="{y + 36}">host {escape(host)}</text>',
        f'<text x="{x + 8}" y="{y + 52}" class="ip">IP {escape(ip)}</text>',
        f'<text x="{x + 8}" y="{y + 68}">{escape(_gpu_text(job))}</text>',
        f'<text x="{x + 8}" y="{y + 84}" class="times">{escape(words.job_times(job, now))}</text>',
        f'<rect x="{x + 8}" y="{y + 92}" width="{NODE_W - 16}" height="{band}" rx="3" fill="{colour}"/>',
        f'<text x="{x + 14}" y="{y + 106}" class="status" fill="#ffffff">{spans}</text>',
        "</g>",
    ]


def node_h(lines: int) -> int:
    return NODE_H + (lines - 1) * LINE_H


def _boxes(jobs) -> list[_Box]:
    """A group's nodes split by TPU pod (one box per slice); nodes on other hosts in one plain box."""
    boxes: dict[str, _Box] = {}
    for job in jobs:
        group = job.instance.group if job.instance is not None else None
        if group is not None and group.kind == GroupKind.TPU_POD:
            key = f"pod:{group.pk}"
            slices = int((group.backend_data or {}).get("slices") or 1)
            shape = f"{slices} x {group.shape}" if slices > 1 and group.shape else group.shape or "slice"
            boxes.setdefault(key, _Box(f"TPU pod {group.name} ({shape})")).jobs.append(job)
        else:
            boxes.setdefault("plain", _Box("")).jobs.append(job)
    return list(boxes.values())


def _group(index: int, members: list, order: str, left: int, top: int, now) -> tuple[list[str], int, int]:
    """One group's box at (left, top): its parts, width and height."""
    cols = min(PER_ROW, max(len(box.jobs) for box in _boxes(members)))
    lines = max(len(status_lines(status_text(j))) for j in members)
    height_of_node = node_h(lines)
    inner_w = cols * NODE_W + (cols - 1) * GAP
    name = members[0].node_group_name
    steps = sorted({start_step(order, j.job_num) for j in members})
    configured = (members[0].run.configuration or {}).get("groups") or []
    depends = configured[index].get("depends_on") if index < len(configured) else None
    if depends:
        steps = ["starts after " + ", ".join(f"{d['group']} is {d.get('condition', 'ready')}" for d in depends)]
    y = top + HEAD
    body: list[str] = []
    for box in _boxes(members):
        rows = (len(box.jobs) + cols - 1) // cols
        box_top = y
        if box.label:
            y += 22
        for i, job in enumerate(box.jobs):
            body += _node(job, left + PAD + (i % cols) * (NODE_W + GAP), y + (i // cols) * (height_of_node + GAP),
                          lines, now)
        y += rows * (height_of_node + GAP)
        if box.label:
            body.insert(0, f'<rect x="{left + PAD - 6}" y="{box_top}" width="{inner_w + 12}" '
                           f'height="{y - box_top}" rx="6" fill="#eef3fb" stroke="#3b5b8c" stroke-dasharray="4 3"/>'
                           f'<text x="{left + PAD}" y="{box_top + 16}" class="pod">{escape(box.label)}</text>')
    height = y + PAD - GAP - top
    width = inner_w + 2 * PAD
    nodes = f"{len(members)} node{'s' if len(members) != 1 else ''}"
    parts = [f'<g class="group" data-group="{escape(name)}">',
             f'<rect x="{left}" y="{top}" width="{width}" height="{height}" rx="8" fill="#f6f7f9" stroke="#8792a2"/>',
             f'<text x="{left + 10}" y="{top + 18}" class="group-name">group {index}: {escape(name)} · {nodes}</text>',
             f'<text x="{left + 10}" y="{top + HEAD - 14}" class="order">{escape("; ".join(steps))}</text>',
             *body, "</g>"]
    return parts, width, height


def render(run, jobs, now=None) -> str:
    """One SVG per group, in rank order (a 3-group PD run reads router | prefill | decode): the
    page lays them side by side while there is room and wraps them onto the next line, so a wide
    screen shows the groups together and a phone one under another."""
    now = now or timezone.now()
    order = (run.configuration or {}).get("startup_order") or "any"
    groups: dict[int, list] = {}
    for job in jobs:
        groups.setdefault(job.node_group_index, []).append(job)
    title = f"run {run.name}: {len(groups)} groups, {len(jobs)} nodes, startup order {order}"
    parts = []
    for index in sorted(groups):
        drawn, w, h = _group(index, groups[index], order, 1, 1, now)
        parts.append(f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w + 2} {h + 2}" width="{w + 2}" '
                     f'class="group-picture" preserveAspectRatio="xMinYMin meet" aria-hidden="true">'
                     + "".join(drawn) + "</svg>")
    return (f'<div class="picture" role="img" aria-label="{escape(title)}" title="{escape(title)}">'
            + "".join(parts) + "</div>")
