"""`muster metrics RUN`: what each job of a run uses on its host, as its runner last sampled it."""

from __future__ import annotations

import argparse
import time
from typing import Any

from cli.follow import segment
from cli.prompts import client_for
from cli.render import table

UNITS = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


def size(n: Any) -> str:
    if not isinstance(n, (int, float)):
        return "?"
    for unit, scale in UNITS:
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return f"{int(n)}B"


def cpu_text(sample: dict[str, Any]) -> str:
    cores = f" of {sample.get('cpus')} cores" if sample.get("cpus") else ""
    percent = sample.get("cpu_percent")
    return f"{percent:g}%{cores}" if isinstance(percent, (int, float)) else f"-{cores}"


def memory_text(sample: dict[str, Any]) -> str:
    used = sample.get("memory_bytes")
    if used is None:
        return "-"
    total = sample.get("memory_total_bytes")
    return size(used) + (f" of {size(total)}" if total else "")


def gpus_text(sample: dict[str, Any]) -> str:
    parts = []
    for gpu in sample.get("gpus") or []:
        util = gpu.get("util_percent")
        text = f"gpu{gpu.get('index')} " + (f"{util:g}%" if isinstance(util, (int, float)) else "-")
        if gpu.get("memory_used_bytes") is not None:
            text += f" {size(gpu['memory_used_bytes'])}"
            if gpu.get("memory_total_bytes"):
                text += f"/{size(gpu['memory_total_bytes'])}"
        parts.append(text)
    return ", ".join(parts) or "-"


def metrics_table(answer: dict[str, Any], history: bool = False, now: float | None = None) -> str:
    now = time.time() if now is None else now
    rows = []
    for job in answer.get("jobs") or []:
        samples = job.get("samples") or []
        shown = samples if history else samples[-1:]
        place = (job.get("job_num"), f"{job.get('node_group_name')}/{job.get('node_group_rank')}",
                 job.get("instance"), job.get("status"))
        if not shown:
            rows.append((*place, "no sample yet", "", "", ""))
        for sample in shown:
            ago = max(0, int(now - float(sample.get("t") or now)))
            rows.append((*place, cpu_text(sample), memory_text(sample), gpus_text(sample), f"{ago}s ago"))
    head = f"run {answer.get('run')}: {answer.get('status')}"
    return head + "\n" + table(["job", "group/rank", "host", "status", "cpu", "memory", "gpus", "sampled"], rows)


def cmd_metrics(args: argparse.Namespace) -> int:
    answer = client_for(args).get(f"runs/{segment(args.run)}/metrics")
    print(metrics_table(answer, history=args.history))
    return 0


def add_metrics_command(sub: Any, command) -> None:
    metrics = command(sub, "metrics", cmd_metrics,
                      help="CPU, memory and GPU use of each job of a run, as its host last sampled it")
    metrics.add_argument("run")
    metrics.add_argument("--history", action="store_true",
                         help="every sample the server keeps (the last 30 of each job), oldest first")
