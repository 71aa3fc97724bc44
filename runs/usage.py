"""A job's resource use as its host's runner sampled it (runner/usage.py): checked, and kept short.

A sample comes from a host the server does not control (a hostile runner, someone else's
nvidia-smi, a job that writes its own usage.json): every value is checked here, a value that is
not a finite number of its kind is dropped (None) and one out of its range is clamped, so what
the console, the API and /metrics show is bounded whatever the host printed. A sample without a
time is dropped whole. A job keeps the last USAGE_KEEP samples (Job.usage), a short history for
the run page and `muster metrics`, never a growing one.
"""

from __future__ import annotations

import math
from typing import Any

USAGE_KEEP = 30
MAX_CPUS = 4096
MAX_MEMORY = 2**50  # 1 PiB: more than any host, small enough for every float and bigint
MAX_GPUS = 64
MAX_GPU_MEMORY = 2**44  # 16 TiB
LATEST_TIME = 2**33  # year 2242: a sample time past it is not one


def _number(value: Any, low: float, high: float) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return min(max(value, low), high)


def _whole(value: Any, high: int) -> int | None:
    number = _number(value, 0, high)
    return None if number is None else int(number)


def _gpu(raw: Any) -> dict[str, Any] | None:
    if not isinstance(raw, dict):
        return None
    index = raw.get("index")
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < 1024:
        return None
    util = _number(raw.get("util_percent"), 0, 100)
    return {"index": index, "util_percent": None if util is None else round(util, 1),
            "memory_used_bytes": _whole(raw.get("memory_used_bytes"), MAX_GPU_MEMORY),
            "memory_total_bytes": _whole(raw.get("memory_total_bytes"), MAX_GPU_MEMORY)}


def clean_sample(raw: Any) -> dict[str, Any] | None:
    """The sample with every value checked (see the module's note), or None when it has no time."""
    if not isinstance(raw, dict):
        return None
    t = _number(raw.get("t"), 0, LATEST_TIME)
    if not t:
        return None
    cpus = _whole(raw.get("cpus"), MAX_CPUS) or 1
    cpu = _number(raw.get("cpu_percent"), 0, 100 * cpus)
    gpus_raw = raw.get("gpus") if isinstance(raw.get("gpus"), list) else []
    gpus = [g for g in (_gpu(item) for item in gpus_raw[:MAX_GPUS]) if g is not None]
    return {"t": float(t), "cpu_percent": None if cpu is None else round(cpu, 1), "cpus": cpus,
            "memory_bytes": _whole(raw.get("memory_bytes"), MAX_MEMORY),
            "memory_total_bytes": _whole(raw.get("memory_total_bytes"), MAX_MEMORY), "gpus": gpus}


def with_sample(history: Any, raw: Any) -> list[dict[str, Any]] | None:
    """`history` with the runner's sample added unless it is the last one kept (the same sample is
    seen by every look until the next is taken); None when nothing changes. Kept in the order they
    came, not by time: a host whose clock stepped back (or a sample dated in 2200) must not stop
    the ones after it."""
    sample = clean_sample(raw)
    history = history if isinstance(history, list) else []
    if sample is None or (history and sample["t"] == history[-1].get("t")):
        return None
    return [*history, sample][-USAGE_KEEP:]


def latest(job) -> dict[str, Any] | None:
    return job.usage[-1] if isinstance(job.usage, list) and job.usage else None


def run_metrics(run) -> dict[str, Any]:
    """What `runs/<name>/metrics` answers: each current job's place and its samples, oldest first."""
    jobs = run.current_jobs().select_related("instance")
    return {"run": run.name, "status": run.status, "jobs": [
        {"job_num": job.job_num, "node_group_name": job.node_group_name, "node_group_rank": job.node_group_rank,
         "instance": job.instance.name if job.instance else None, "status": job.status,
         "samples": job.usage if isinstance(job.usage, list) else []}
        for job in jobs]}
