"""The run's picture: an SVG drawn on the server from the jobs and their hosts.

Groups are stacked top to bottom in rank order; each group's nodes sit in rows inside it. Nodes
on the hosts of one TPU pod slice are drawn inside one pod box, so the slice reads as one machine.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.utils.html import escape

# colour per status, chosen for contrast against white text (WCAG AA at 12px bold); the word is
# always printed beside the colour so nobody needs to tell colours apart
STATUS_COLOURS = {
    "submitted": "#5a6270", "provisioning": "#7a5b00", "pulling": "#7a5b00", "running": "#0b5cad",
    "terminating": "#8a4b00", "terminated": "#4a4a4a", "aborted": "#8b1a1a", "failed": "#b00020",
    "done": "#1d6b2f",
}
NODE_W, NODE_H, GAP, PAD, HEAD = 220, 104, 12, 14, 30
PER_ROW = 4


def start_step(order: str, job_num: int) -> str:
    """When a node starts, as the engine enforces it (runs.progress._order_allows)."""
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


def _node(job, x: int, y: int) -> list[str]:
    colour = STATUS_COLOURS.get(job.status, "#5a6270")
    inst = job.instance
    host = inst.name if inst else "no host yet"
    ip = (inst.internal_ip or inst.hostname) if inst else "-"
    rank = f"rank {job.node_group_rank} · global {job.job_num}{' · master' if job.job_num == 0 else ''}"
    status = job.status + (f" ({job.termination_reason})" if job.termination_reason else "")
    return [
        f'<g class="node" data-job="{job.job_num}" data-status="{escape(job.status)}">',
        f'<title>job {job.job_num}: {escape(status)}</title>',
        f'<rect x="{x}" y="{y}" width="{NODE_W}" height="{NODE_H}" rx="6" fill="#ffffff" stroke="{colour}" '
        f'stroke-width="2"/>',
        f'<text x="{x + 8}" y="{y + 18}" class="rank">{escape(rank)}</text>',
        f'<text x="{x + 8}" y="{y + 36}">host {escape(host)}</text>',
        f'<text x="{x + 8}" y="{y + 52}" class="ip">IP {escape(ip)}</text>',
        f'<text x="{x + 8}" y="{y + 68}">{escape(_gpu_text(job))}</text>',
        f'<rect x="{x + 8}" y="{y + 76}" width="{NODE_W - 16}" height="20" rx="3" fill="{colour}"/>',
        f'<text x="{x + 14}" y="{y + 90}" class="status" fill="#ffffff">{escape(status[:34])}</text>',
        "</g>",
    ]


def _boxes(jobs) -> list[_Box]:
    """A group's nodes split by TPU pod (one box per slice); nodes on other hosts in one plain box."""
    boxes: dict[str, _Box] = {}
    for job in jobs:
        group = job.instance.group if job.instance is not None else None
        if group is not None and group.kind == "tpu_pod":
            key = f"pod:{group.pk}"
            boxes.setdefault(key, _Box(f"TPU pod {group.name} ({group.shape or 'slice'})")).jobs.append(job)
        else:
            boxes.setdefault("plain", _Box("")).jobs.append(job)
    return list(boxes.values())


def render(run, jobs) -> str:
    order = (run.configuration or {}).get("startup_order") or "any"
    groups: dict[int, list] = {}
    for job in jobs:
        groups.setdefault(job.node_group_index, []).append(job)
    inner_w = PER_ROW * NODE_W + (PER_ROW - 1) * GAP
    width = inner_w + 4 * PAD
    parts: list[str] = []
    y = PAD
    for index in sorted(groups):
        members = groups[index]
        name = members[0].node_group_name
        steps = sorted({start_step(order, j.job_num) for j in members})
        top = y
        y += HEAD
        body: list[str] = []
        for box in _boxes(members):
            rows = (len(box.jobs) + PER_ROW - 1) // PER_ROW
            box_top = y
            if box.label:
                y += 22
            for i, job in enumerate(box.jobs):
                body += _node(job, 2 * PAD + (i % PER_ROW) * (NODE_W + GAP), y + (i // PER_ROW) * (NODE_H + GAP))
            y += rows * (NODE_H + GAP)
            if box.label:
                body.insert(0, f'<rect x="{2 * PAD - 6}" y="{box_top}" width="{inner_w + 12}" '
                               f'height="{y - box_top}" rx="6" fill="#eef3fb" stroke="#3b5b8c" '
                               f'stroke-dasharray="4 3"/>'
                               f'<text x="{2 * PAD}" y="{box_top + 16}" class="pod">{escape(box.label)}</text>')
        y += PAD - GAP
        label = f"group {index}: {name} · {len(members)} node{'s' if len(members) != 1 else ''} · {'; '.join(steps)}"
        parts.append(f'<g class="group" data-group="{escape(name)}">')
        parts.append(f'<rect x="{PAD}" y="{top}" width="{width - 2 * PAD}" height="{y - top}" rx="8" '
                     f'fill="#f6f7f9" stroke="#8792a2"/>')
        parts.append(f'<text x="{PAD + 10}" y="{top + 20}" class="group-name">{escape(label)}</text>')
        parts += body
        parts.append("</g>")
        y += GAP
    height = y + PAD - GAP
    title = f"run {run.name}: {len(groups)} groups, {len(jobs)} nodes, startup order {order}"
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" role="img" '
            f'aria-labelledby="pic-title" class="picture" preserveAspectRatio="xMinYMin meet">'
            f'<title id="pic-title">{escape(title)}</title>' + "".join(parts) + "</svg>")
