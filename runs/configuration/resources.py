"""The resources grammar (`cpu`, `memory`, `disk`, `shm_size`, `gpu`): a written block in, the
normalized form (`requirements.Resources`) out.

A single value means exactly that much (`cpu: 4`, `gpu: L40S` = one L40S); a range is written
`a..b`, `a..` or `..b`, and a missing bound is stored as None. The same rules apply to the top
level of a task, to each of its groups and to cloud fleets. The `gpu` value has its own grammar
(`gpu_spec`); this module reads the block, cpu, sizes and defaults.
"""

from __future__ import annotations

from typing import Any

from .errors import ConfigurationError, ErrorList
from .gpu_spec import ProbedNames, check_gpu_names, parse_gpu
from .gpus import needs_arm
from .ranges import parse_count_range, parse_size, parse_size_range
from .requirements import CpuRequirement, GpuRequirement, Resources, SizeRange

# Defaults for whatever a resources block leaves out (the docs quote these).
DEFAULT_CPU_MIN = 1
DEFAULT_MEMORY_MIN_GB = 1.0
DEFAULT_DISK_MIN_GB = 1.0
DEFAULT_CPU_ARCH = "x86"

RESOURCE_KEYS = ("cpu", "memory", "shm_size", "disk", "gpu")
# dropped by the task parser when the task has an image (runs/configuration/task.py)
SHM_WITHOUT_IMAGE = ("sizes the container's /dev/shm, for jobs with `image`: this task has none, so a job "
                     "uses the host's /dev/shm")
# fmt: off
_CPU_ARCH_ALIASES = {
    "x86": "x86", "x86_64": "x86", "amd64": "x86",
    "arm": "arm", "arm64": "arm", "aarch64": "arm",
}
# fmt: on
_CPU_OBJECT_KEYS = ("arch", "count")
# (field, message): what a written key does not do here, shown with the plan.
Warnings = list[dict[str, Any]]


def parse_resources(
    raw: object, *, warnings: Warnings | None = None, probed_gpu_names: ProbedNames | None = None
) -> Resources:
    """A written resources block -> Resources; ConfigurationError locations are relative to it.

    `warnings` collects (relative) notes on keys that are accepted but do not take effect here;
    `probed_gpu_names` lets a GPU name outside the known table through if a host of the project has it.
    """
    errors = ErrorList()
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        errors.add([], "resources must be a mapping with cpu, memory, shm_size, disk and gpu")
        errors.raise_if_any()
    assert isinstance(raw, dict)
    for key in raw:
        if key not in RESOURCE_KEYS:
            errors.add([key], f"unknown key `{key}`: resources take {', '.join(RESOURCE_KEYS)}")

    cpu: tuple[int | None, int | None, str | None] = (DEFAULT_CPU_MIN, None, None)
    memory: tuple[float | None, float | None] = (DEFAULT_MEMORY_MIN_GB, None)
    disk: tuple[float | None, float | None] = (DEFAULT_DISK_MIN_GB, None)
    shm_size: float | None = None
    gpu: GpuRequirement | None = None
    try:
        if raw.get("cpu") is not None:
            cpu = parse_cpu(raw["cpu"])
    except ValueError as exc:
        errors.add(["cpu"], str(exc))
    for key in ("memory", "disk"):
        try:
            if raw.get(key) is not None:
                written = raw[key]
                if key == "disk" and isinstance(written, dict) and "size" in written:
                    # dstack's disk object form: {size: 100GB..}
                    if set(written) != {"size"}:
                        raise ValueError("the disk object takes only `size`")
                    written = written["size"]
                value = parse_size_range(written)
                memory, disk = (value, disk) if key == "memory" else (memory, value)
        except ValueError as exc:
            errors.add([key], str(exc))
    try:
        if raw.get("shm_size") is not None:
            shm_size = parse_size(raw["shm_size"])
    except ValueError as exc:
        errors.add(["shm_size"], str(exc))
    try:
        if raw.get("gpu") is not None:
            gpu = parse_gpu(raw["gpu"])
            check_gpu_names(gpu, probed_gpu_names)
    except ValueError as exc:
        errors.add(["gpu"], str(exc))
    except ConfigurationError as exc:
        errors.extend_from(exc, ["gpu"])

    arch = cpu[2]
    if gpu is not None and needs_arm(gpu.names):
        if arch == "x86":
            arm_names = ", ".join(n for n in gpu.names if needs_arm([n]))
            errors.add(["cpu"], f"{arm_names} hosts have arm CPUs: use `arm` (or leave the arch out)")
        arch = "arm"
    errors.raise_if_any()
    if warnings is not None:
        if shm_size is not None:
            warnings.append({"field": ["shm_size"], "message": (
                f"shm_size: {raw['shm_size']} {SHM_WITHOUT_IMAGE}")})
        if gpu is not None and gpu.compute_capability is not None:
            warnings.append({"field": ["gpu", "compute_capability"], "message": (
                f"compute_capability: {gpu.compute_capability} is not checked: hosts do not report it; "
                "name the GPUs (e.g. gpu: A100) to be sure of it")})
    return Resources(
        cpu=CpuRequirement(min=cpu[0], max=cpu[1], arch=arch or DEFAULT_CPU_ARCH),  # type: ignore[arg-type]
        memory=SizeRange(min=memory[0], max=memory[1]),
        disk=SizeRange(min=disk[0], max=disk[1]),
        gpu=gpu,
        shm_size=shm_size,
    )


def parse_cpu(value: object) -> tuple[int | None, int | None, str | None]:
    """`4`, `2..8`, `arm:8`, `x86:4..`, `arm`, {arch, count} -> (min, max, arch or None when not said)."""
    if isinstance(value, dict) and not (set(value) <= {"min", "max"}):
        # a key of neither form is the one to name (`{min: 2, foo: 3}`: `foo`, not `min`)
        unknown = [str(k) for k in value if k not in (*_CPU_OBJECT_KEYS, "min", "max")] or \
            [str(k) for k in value if k not in _CPU_OBJECT_KEYS]
        if unknown:
            raise ValueError(f"unknown key `{unknown[0]}` in cpu: the object form takes arch and count "
                             "(or min and max, a range)")
        arch_written = value.get("arch")
        arch_value = None
        if arch_written is not None:
            if not isinstance(arch_written, str) or arch_written.strip().lower() not in _CPU_ARCH_ALIASES:
                raise ValueError("cpu arch must be x86 or arm")
            arch_value = _CPU_ARCH_ALIASES[arch_written.strip().lower()]
        count = value.get("count")
        low, high = parse_count_range(count, "cpu") if count is not None else (DEFAULT_CPU_MIN, None)
        return low, high, arch_value
    if isinstance(value, dict):
        low, high = parse_count_range(value, "cpu")
        return low, high, None
    if isinstance(value, int) and not isinstance(value, bool):
        low, high = parse_count_range(value, "cpu")
        return low, high, None
    if not isinstance(value, str):
        raise ValueError("cpu must be a number, a range like 2..8, or arch:count like arm:8")
    arch: str | None = None
    count: tuple[int | None, int | None] | None = None
    for token in (t.strip() for t in value.split(":")):
        if token.lower() in _CPU_ARCH_ALIASES:
            if arch is not None:
                raise ValueError(f"cpu `{value}` names the architecture twice")
            arch = _CPU_ARCH_ALIASES[token.lower()]
        else:
            if count is not None:
                raise ValueError(f"cpu `{value}` gives the count twice")
            count = parse_count_range(token, "cpu")
    low, high = count if count is not None else (DEFAULT_CPU_MIN, None)
    return low, high, arch


