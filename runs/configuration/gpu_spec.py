"""The `gpu:` grammar: a spec string (`L40S`, `A100:80GB:8`, `24GB:1..2`, `amd:MI300X:8`,
`tpu-v2-32`), a bare count, or the object form, read into a GpuRequirement.

The largest part of the resources grammar and the only one that knows vendors, GPU names and TPU
slices, so it has its own module; `resources` reads the rest of the block and calls in here.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Collection

from backends.registry import (
    SliceShape,
    looks_like_slice,
    parse_slice,
    slice_with_topology,
    tpu_family_named,
    valid_sizes_message,
)

from .errors import ErrorList
from .gpus import VENDOR_ALIASES, VENDORS, canonical_name, known_names, name_key, vendor_of
from .ranges import has_size_unit, parse_count_range, parse_size_range
from .requirements import GpuRequirement, IntRange, SizeRange

# `gpu: L40S` with no count means one GPU.
DEFAULT_GPU_COUNT = 1
_GPU_OBJECT_KEYS = ("vendor", "name", "count", "memory", "total_memory", "compute_capability", "topology")
# Names probed on the project's hosts, asked for only when a name is not in the known table.
ProbedNames = Callable[[], Collection[str]]


def check_gpu_names(gpu: GpuRequirement, probed: ProbedNames | None) -> None:
    """A name must be in the known table or on a host of the project: a typo (`H1000`) would
    otherwise wait for a host that cannot exist and fail long after the submit."""
    unknown = [n for n in gpu.names if vendor_of(n) is None]
    if not unknown:
        return
    probed_names = {name_key(n): n for n in (probed() if probed is not None else ())}
    unknown = [n for n in unknown if name_key(n) not in probed_names]
    if not unknown:
        return
    candidates = [*known_names(), *probed_names.values()]
    problems = []
    for name in unknown:
        close = difflib.get_close_matches(name.upper(), [c.upper() for c in candidates], n=3, cutoff=0.6)
        spelled = [next(c for c in candidates if c.upper() == m) for m in close]
        hint = f": did you mean {' or '.join(spelled)}?" if spelled else ""
        problems.append(f"unknown GPU `{name}`{hint}")
    raise ValueError(
        "; ".join(problems) + " (a name must be a known GPU or one found on a host of this project)"
    )


def parse_gpu(value: object) -> GpuRequirement:
    """A gpu spec (`L40S`, `A100:80GB:8`, `24GB:1..2`, `amd:MI300X:8`, `tpu-v2-32`), a count, or
    the object form {vendor, name, count, memory}."""
    if isinstance(value, bool):
        raise ValueError("gpu must be a spec like L40S, A100:80GB:8 or tpu-v2-32")
    if isinstance(value, int):
        low, high = parse_count_range(value, "gpu count")
        return _build_gpu(None, [], (low, high), None)
    if isinstance(value, dict):
        return _parse_gpu_object(value)
    if not isinstance(value, str) or not value.strip():
        raise ValueError("gpu must be a spec like L40S, A100:80GB:8 or tpu-v2-32")
    return _parse_gpu_spec(value)


def _parse_gpu_spec(spec: str) -> GpuRequirement:
    vendor: str | None = None
    names: list[str] | None = None
    count: tuple[int | None, int | None] | None = None
    memory: tuple[float | None, float | None] | None = None
    shape: SliceShape | None = None
    for token in (t.strip() for t in spec.split(":")):
        lowered = token.lower()
        if not token:
            raise ValueError(f"gpu `{spec}` has an empty part")
        if lowered in VENDOR_ALIASES:
            if vendor is not None:
                raise ValueError(f"gpu `{spec}` names the vendor twice")
            vendor = VENDOR_ALIASES[lowered]
        elif looks_like_slice(token):
            if shape is not None:
                raise ValueError(f"gpu `{spec}` names two TPU slices")
            shape = _slice(token)
        elif has_size_unit(token):
            if memory is not None:
                raise ValueError(f"gpu `{spec}` gives the memory twice")
            memory = parse_size_range(token)
        elif token[0] in "0123456789" or token.startswith(".."):
            if count is not None:
                raise ValueError(f"gpu `{spec}` gives the count twice")
            count = parse_count_range(token, "gpu count")
        elif token[0].isalpha():
            if names is not None:
                raise ValueError(f"gpu `{spec}` lists names twice: use one comma list like H100,A100")
            names = _split_names(token)
        else:
            raise ValueError(f"cannot read `{token}` in gpu `{spec}`")
    if shape is not None:
        if names or count is not None or memory is not None:
            raise ValueError(f"a TPU slice takes no name, count or memory: write just `{shape.name}`")
        return _tpu(shape, vendor)
    if not names and "tpu" in (t.strip().lower() for t in spec.split(":")):
        raise ValueError(f"`tpu` needs a slice name like tpu-v2-8; {valid_sizes_message('')}")
    return _build_gpu(vendor, names or [], count, memory)


def _parse_gpu_object(raw: dict) -> GpuRequirement:
    errors = ErrorList()
    for key in raw:
        if key not in _GPU_OBJECT_KEYS:
            errors.add([key], f"unknown key `{key}`")
    vendor: str | None = None
    names: list[str] = []
    count = None
    memory = None
    shape: SliceShape | None = None
    try:
        if raw.get("vendor") is not None:
            vendor = _vendor(raw["vendor"])
    except ValueError as exc:
        errors.add(["vendor"], str(exc))
    if raw.get("topology") is not None:
        return _topology_slice(raw, vendor, errors)
    try:
        written = raw.get("name")
        if written is not None:
            if isinstance(written, str):
                written = [written]
            if not isinstance(written, list) or not all(isinstance(n, str) and n.strip() for n in written):
                raise ValueError("name must be a GPU name or a list of names")
            for name in written:
                if looks_like_slice(name):
                    if len(written) > 1:
                        raise ValueError("a TPU slice cannot be combined with other names")
                    shape = _slice(name)
                else:
                    names.extend(_split_names(name))
    except ValueError as exc:
        errors.add(["name"], str(exc))
    try:
        if raw.get("count") is not None:
            count = parse_count_range(raw["count"], "gpu count")
    except ValueError as exc:
        errors.add(["count"], str(exc))
    try:
        if raw.get("memory") is not None:
            memory = parse_size_range(raw["memory"])
    except ValueError as exc:
        errors.add(["memory"], str(exc))
    total_memory = None
    try:
        if raw.get("total_memory") is not None:
            total_memory = parse_size_range(raw["total_memory"])
    except ValueError as exc:
        errors.add(["total_memory"], str(exc))
    capability = None
    try:
        if raw.get("compute_capability") is not None:
            capability = _compute_capability(raw["compute_capability"])
    except ValueError as exc:
        errors.add(["compute_capability"], str(exc))
    errors.raise_if_any()
    if shape is not None:
        if count is not None or memory is not None or total_memory is not None:
            raise ValueError(f"a TPU slice takes no count or memory: write just `{shape.name}`")
        return _tpu(shape, vendor)
    gpu = _build_gpu(vendor, names, count, memory)
    if total_memory is None and capability is None:
        return gpu
    return gpu.model_copy(update={
        "total_memory": SizeRange(min=total_memory[0], max=total_memory[1]) if total_memory else None,
        "compute_capability": capability,
    })


def _compute_capability(value: object) -> str:
    """`8.0`, `"8.0"` or `[8, 0]` -> "8.0"."""
    if isinstance(value, list) and len(value) == 2 and all(type(v) is int for v in value):
        return f"{value[0]}.{value[1]}"
    if isinstance(value, float):
        value = str(value)
    if isinstance(value, str):
        major, dot, minor = value.strip().partition(".")
        if dot and major.isdigit() and minor.isdigit():
            return f"{int(major)}.{int(minor)}"
    raise ValueError("compute_capability must be like 8.0 (major.minor)")


def _vendor(value: object) -> str:
    if not isinstance(value, str) or value.strip().lower() not in VENDOR_ALIASES:
        raise ValueError(f"vendor must be one of {', '.join(VENDORS)}")
    return VENDOR_ALIASES[value.strip().lower()]


def _split_names(token: str) -> list[str]:
    names = [canonical_name(n) for n in token.split(",") if n.strip()]
    if not names:
        raise ValueError(f"no GPU name in `{token}`")
    return names


def _topology_slice(raw: dict, vendor: str | None, errors: ErrorList) -> GpuRequirement:
    """`{name: tpu-v5litepod, topology: 4x4}` (or with the size, `tpu-v5litepod-16`): the slice
    Google makes from the family and the topology (its AcceleratorConfig), whose chips decide the
    hosts."""
    name = raw.get("name")
    shape = None
    if not isinstance(name, str) or not name.strip():
        errors.add(["name"], "a topology needs the TPU family in name, e.g. name: tpu-v5litepod")
    else:
        base = parse_slice(name) if looks_like_slice(name) else None
        family = base.family if base is not None else tpu_family_named(name)
        if family is None:
            errors.add(["name"], f"`{name}` is no TPU family or slice: a topology is for TPUs "
                       "(name: tpu-v5litepod, tpu-v6e, tpu-v4, tpu-v5p)")
        elif base is None and looks_like_slice(name):
            errors.add(["name"], f"unknown TPU slice `{name}`: {valid_sizes_message(name)}")
        else:
            try:
                shape = slice_with_topology(family, str(raw["topology"]), base.size if base else None)
            except ValueError as exc:
                errors.add(["topology"], str(exc))
    for key in ("count", "memory", "total_memory", "compute_capability"):
        if raw.get(key) is not None:
            errors.add([key], "a TPU slice takes no count or memory: the topology decides the chips")
    errors.raise_if_any()
    assert shape is not None
    return _tpu(shape, vendor)


def _slice(token: str) -> SliceShape:
    shape = parse_slice(token)
    if shape is None:
        raise ValueError(f"unknown TPU slice `{token}`: {valid_sizes_message(token)}")
    return shape


def _tpu(shape: SliceShape, vendor: str | None) -> GpuRequirement:
    if vendor not in (None, "google"):
        raise ValueError(f"TPU slice {shape.name} is made by google, not {vendor}")
    per_host = shape.chips_per_host
    return GpuRequirement(
        vendor="google", names=[], count=IntRange(min=per_host, max=per_host), memory=None, tpu=shape.name
    )


def _build_gpu(
    vendor: str | None,
    names: list[str],
    count: tuple[int | None, int | None] | None,
    memory: tuple[float | None, float | None] | None,
) -> GpuRequirement:
    inferred = {v for v in (vendor_of(n) for n in names) if v is not None}
    if vendor is not None:
        wrong = [n for n in names if vendor_of(n) not in (None, vendor)]
        if wrong:
            raise ValueError(f"{wrong[0]} is made by {vendor_of(wrong[0])}, not {vendor}")
    elif len(inferred) > 1:
        raise ValueError(f"gpu names mix vendors ({', '.join(sorted(inferred))}): list GPUs of one vendor")
    elif inferred:
        vendor = inferred.pop()
    low, high = count if count is not None else (DEFAULT_GPU_COUNT, DEFAULT_GPU_COUNT)
    return GpuRequirement(
        vendor=vendor,  # type: ignore[arg-type]
        names=names,
        count=IntRange(min=low, max=high),
        memory=SizeRange(min=memory[0], max=memory[1]) if memory else None,
        tpu=None,
    )
