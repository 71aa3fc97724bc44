"""Does a job's normalized resources requirement fit an instance, and how many GPUs does it use?

Only lower bounds filter hosts: a job asking for `cpu: 4` fits a 64-core host, and a GPU count's
upper bound caps what the job takes rather than excluding bigger hosts. A job that says nothing
about GPUs fits any non-TPU host and uses all of its GPUs (the whole host is the job's).

Instance resources: {"cpus": int, "memory_gb": float, "disk_gb": float, "cpu_arch": "x86"|"arm",
"gpus": [{"name", "memory_gb", "vendor"}], "tpu": slice name or None}.
"""

from __future__ import annotations

from typing import Any

from backends.registry import parse_slice

from .gpus import name_key


def fits(requirements: dict[str, Any], resources: dict[str, Any]) -> bool:
    # A job with `image` needs a host whose Docker answered the probe. TPU VMs are not probed: their
    # runtime images ship Docker, which is what dstack relies on there too.
    if requirements.get("docker") and not resources.get("docker") and not resources.get("tpu"):
        return False
    cpu = requirements.get("cpu") or {}
    if cpu.get("arch") and cpu["arch"] != (resources.get("cpu_arch") or "x86"):
        return False
    if not _at_least(resources.get("cpus"), cpu.get("min")):
        return False
    if not _at_least(resources.get("memory_gb"), (requirements.get("memory") or {}).get("min")):
        return False
    if not _at_least(resources.get("disk_gb"), (requirements.get("disk") or {}).get("min")):
        return False

    gpu = requirements.get("gpu")
    host_tpu = _canonical_slice(resources.get("tpu"))
    if gpu is not None and gpu.get("tpu"):
        return host_tpu is not None and host_tpu == _canonical_slice(gpu["tpu"])
    if host_tpu is not None:
        return False  # TPU hosts are kept for TPU jobs
    if gpu is None:
        return True
    matching = _matching_gpus(gpu, resources)
    if len(matching) < ((gpu.get("count") or {}).get("min") or 0):
        return False
    total = (gpu.get("total_memory") or {}).get("min")
    if total is not None:
        # the memory of the GPUs the node would take (count's upper bound caps them)
        cap = (gpu.get("count") or {}).get("max")
        taken = matching if cap is None else matching[:cap]
        return sum(g.get("memory_gb") or 0 for g in taken) >= total
    return True


def gpu_count_for(requirements: dict[str, Any], resources: dict[str, Any]) -> int:
    """GPUs (or TPU chips) the job uses on that host; 0 on a CPU host."""
    shape = parse_slice(resources["tpu"]) if resources.get("tpu") else None
    if shape is not None:
        return shape.chips_per_host
    gpu = requirements.get("gpu")
    if gpu is None:
        return len(resources.get("gpus") or [])
    available = len(_matching_gpus(gpu, resources))
    cap = (gpu.get("count") or {}).get("max")
    return available if cap is None else min(available, cap)


def _at_least(have: Any, need: Any) -> bool:
    if need is None:
        return True
    return have is not None and have >= need


def _canonical_slice(name: str | None) -> str | None:
    if not name:
        return None
    shape = parse_slice(name)
    return shape.name if shape else name.strip().lower()


def _matching_gpus(gpu: dict[str, Any], resources: dict[str, Any]) -> list[dict[str, Any]]:
    names = {name_key(n) for n in gpu.get("names") or []}
    vendor = gpu.get("vendor")
    memory = gpu.get("memory") or {}
    matching = []
    for host_gpu in resources.get("gpus") or []:
        if names and name_key(str(host_gpu.get("name", ""))) not in names:
            continue
        if vendor and str(host_gpu.get("vendor") or "").lower() not in ("", vendor):
            continue
        size = host_gpu.get("memory_gb")
        if memory.get("min") is not None and (size is None or size < memory["min"]):
            continue
        if memory.get("max") is not None and (size is None or size > memory["max"]):
            continue
        matching.append(host_gpu)
    return matching
