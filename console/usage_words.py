"""A job's last usage sample (runs/usage.py) in words for the run page: CPU, memory, GPUs."""

from __future__ import annotations

from runs import usage

UNITS = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


def size(n: int) -> str:
    for unit, scale in UNITS:
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def cells(job) -> dict[str, str]:
    """{"cpu", "memory", "gpus"} of the job's last sample; dashes before the first."""
    sample = usage.latest(job)
    if sample is None:
        return {"cpu": "-", "memory": "-", "gpus": "-"}
    cpu = sample.get("cpu_percent")
    memory, total = sample.get("memory_bytes"), sample.get("memory_total_bytes")
    gpus = []
    for gpu in sample.get("gpus") or []:
        text = f"GPU {gpu['index']}: " + ("-" if gpu.get("util_percent") is None else f"{gpu['util_percent']:g}%")
        if gpu.get("memory_used_bytes") is not None:
            text += f", {size(gpu['memory_used_bytes'])}"
            if gpu.get("memory_total_bytes"):
                text += f" of {size(gpu['memory_total_bytes'])}"
        gpus.append(text)
    return {"cpu": ("-" if cpu is None else f"{cpu:g}%") + f" of {sample.get('cpus')} cores",
            "memory": "-" if memory is None else size(memory) + (f" of {size(total)}" if total else ""),
            "gpus": "; ".join(gpus) or "-"}
