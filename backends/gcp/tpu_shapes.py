"""The TPU slice-shape table: the one place that knows how a slice name (or a family and an
explicit topology) maps to hosts and chips.

Used by the configuration language (to expand `gpu: v2-32` into 4 nodes and reject unknown
slices), by the gcp backend (offers and provisioning) and by the docs. Each row of FAMILIES cites
the Google page its numbers come from.

A slice asked for with an explicit topology (`gpu: {name: tpu-v5litepod, topology: 4x4}`) keeps it
in its canonical name, `v5litepod-16@4x4`: the name is what offers, pods and reuse compare, and a
4x4 slice is not interchangeable with a 2x8 one of the same chip count.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class TpuFamily:
    name: str  # the prefix in the slice name: v2, v3, v4, v5p, v5litepod, v6e
    counts_cores: bool  # True: the -N suffix counts TensorCores (2 per chip); False: it counts chips
    sizes: tuple[int, ...]  # valid -N suffixes
    hbm_gb_per_chip: int
    accelerator_config_type: str  # the TPU API's AcceleratorConfig.Type ("": the client has none)
    default_runtime_version: str  # "": none documented, the fleet must set runtime_version
    chips_per_host: int = 4  # of a multi-host slice (v5litepod/v6e: one host carries up to 8)
    topology_dims: int = 2  # AxB (2-D torus) or AxBxC (3-D)
    max_dim: int = 16  # the longest side Google lists for the family


def _powers_of_two(lo: int, hi: int) -> tuple[int, ...]:
    out, n = [], lo
    while n <= hi:
        out.append(n)
        n *= 2
    return tuple(out)


FAMILIES: dict[str, TpuFamily] = {
    f.name: f
    for f in (
        # cloud.google.com/tpu/docs/v2 and /v3 ("TPU v2" / "TPU v3": 4 chips, 8 TensorCores per
        # host; v2 and v3 slice configurations; 16 / 32 GiB HBM per chip).
        TpuFamily("v2", True, (8, 32, 128, 256, 512), 16, "V2", "tpu-ubuntu2204-base"),
        TpuFamily("v3", True, (8, 32, 64, 128, 256, 512, 1024, 2048), 32, "V3", "tpu-ubuntu2204-base"),
        # cloud.google.com/tpu/docs/v4 ("System architecture", "Topologies": AxBxC, 4 chips per
        # host, 2 TensorCores per chip, 32 GiB HBM per chip).
        TpuFamily("v4", True, _powers_of_two(8, 4096), 32, "V4", "tpu-ubuntu2204-base", topology_dims=3),
        # cloud.google.com/tpu/docs/v5p ("System architecture", "Configurations": AxBxC, 4 chips
        # per host, 2 TensorCores per chip, 95 GiB HBM per chip).
        TpuFamily("v5p", True, _powers_of_two(8, 8192), 95, "V5P", "v2-alpha-tpuv5", topology_dims=3),
        # cloud.google.com/tpu/docs/v5e ("v5e slice types": 1x1 .. 16x16, 1, 4 or 8 chips on a
        # single host, 4 per host in multi-host slices, 16 GiB HBM per chip).
        TpuFamily("v5litepod", False, (1, 4, 8, 16, 32, 64, 128, 256), 16, "V5LITE_POD", "v2-alpha-tpuv5-lite"),
        # cloud.google.com/tpu/docs/v6e ("Supported configurations": 1x1 .. 16x16, as v5e; 32 GiB
        # HBM per chip).
        TpuFamily("v6e", False, (1, 4, 8, 16, 32, 64, 128, 256), 32, "V6E", "v2-alpha-tpuv6e"),
        # cloud.google.com/tpu/docs/tpu7x ("TPU7x (Ironwood)", "System architecture": 2 TensorCores
        # per chip, 192 GiB HBM per chip, a 4-chip VM, 9,216 chips per pod; `tpu7x-N` counts
        # TensorCores as v5p does). Google documents no TPU VM runtime version for it (it points
        # to GKE), and google-cloud-tpu has no AcceleratorConfig type for it: a tpu7x fleet sets
        # `runtime_version`, and a topology cannot be asked for (the slice name decides).
        TpuFamily("tpu7x", True, _powers_of_two(8, 8192), 192, "", "", topology_dims=3),
    )
}
# Names Google and users also write for a family.
ALIASES = {"v5e": "v5litepod", "v7x": "tpu7x"}

# The port of a multislice set's (megascale) coordinator on slice 0 worker 0, as Google's queued
# resources and Ray set it; jax.distributed strips it and uses its own port (8482) on that host.
MEGASCALE_PORT = 8081

_FAMILY_RE = r"(v2|v3|v4|v5p|v5litepod|v5e|v6e|v7x|tpu7x)"
_SLICE_RE = re.compile(rf"^(?:tpu-)?{_FAMILY_RE}-(\d+)(?:@(\d+(?:x\d+)+))?$")
_TOPOLOGY_RE = re.compile(r"^\d+(?:x\d+)+$")


@dataclass(frozen=True)
class SliceShape:
    family: TpuFamily
    size: int
    topology: str = ""  # explicit AxB / AxBxC, sent as AcceleratorConfig; "": the name decides

    @property
    def name(self) -> str:
        base = f"{self.family.name}-{self.size}"
        return f"{base}@{self.topology}" if self.topology else base

    @property
    def accelerator_type(self) -> str:
        """The TPU API's acceleratorType for this size (without the topology)."""
        return f"{self.family.name}-{self.size}"

    @property
    def chips(self) -> int:
        return self.size // 2 if self.family.counts_cores else self.size

    @property
    def hosts(self) -> int:
        if self.family.counts_cores:
            return max(1, self.chips // self.family.chips_per_host)
        return 1 if self.size <= 8 else self.size // self.family.chips_per_host

    @property
    def chips_per_host(self) -> int:
        return self.chips // self.hosts

    @property
    def hbm_gb(self) -> int:
        return self.chips * self.family.hbm_gb_per_chip

    @property
    def hbm_gb_per_host(self) -> int:
        return self.chips_per_host * self.family.hbm_gb_per_chip


def looks_like_slice(text: str) -> bool:
    """True for anything shaped like a slice name, valid or not (so `v2-12` gets a slice error)."""
    return bool(re.match(r"^(?:tpu-)?(?:v|tpu)\d+[a-z]*-\d+(?:@[\dx]+)?$", text.strip().lower()))


def family_named(text: str) -> TpuFamily | None:
    """`tpu-v5litepod`, `v5e`, `tpu7x` -> the family; None for anything else."""
    name = text.strip().lower().removeprefix("tpu-") if text.strip().lower() != "tpu7x" else "tpu7x"
    return FAMILIES.get(ALIASES.get(name, name))


def parse_slice(text: str) -> SliceShape | None:
    """`v2-32`, `tpu-v2-32`, `v5e-8` (alias of v5litepod), `tpu7x-16` or a canonical name with
    its topology (`v5litepod-16@4x4`) -> SliceShape; None when unknown."""
    m = _SLICE_RE.match(text.strip().lower())
    if not m:
        return None
    family = FAMILIES[ALIASES.get(m.group(1), m.group(1))]
    size = int(m.group(2))
    if size not in family.sizes:
        return None
    if m.group(3):
        try:
            return with_topology(family, m.group(3), size)
        except ValueError:
            return None
    return SliceShape(family, size)


def with_topology(family: TpuFamily, topology: str, size: int | None = None) -> SliceShape:
    """The slice of `family` with this explicit topology; ValueError saying what is wrong when the
    topology does not fit the family (or the slice size given with it)."""
    text = str(topology).strip().lower()
    if not family.accelerator_config_type:
        raise ValueError(f"{family.name} slices cannot be asked for by topology (the TPU API client has no "
                         f"accelerator type for {family.name}): write the slice name, e.g. {family.name}-"
                         f"{family.sizes[1] if len(family.sizes) > 1 else family.sizes[0]}, and no topology")
    example = "x".join(["4"] * family.topology_dims)
    if not _TOPOLOGY_RE.match(text):
        raise ValueError(f"topology must be like {example} (chips along each side), not {topology!r}")
    dims = [int(d) for d in text.split("x")]
    if len(dims) != family.topology_dims:
        raise ValueError(f"{family.name} topologies have {family.topology_dims} sides (like {example}), "
                         f"not {len(dims)} ({text})")
    if any(d < 1 or d & (d - 1) or d > family.max_dim for d in dims):
        raise ValueError(f"each side of a {family.name} topology is a power of two up to {family.max_dim}, "
                         f"not {text}")
    chips = 1
    for d in dims:
        chips *= d
    cores = chips * 2 if family.counts_cores else chips
    if cores not in family.sizes:
        raise ValueError(f"topology {text} has {chips} chips, which is no {family.name} slice: "
                         + valid_sizes_message(f"{family.name}-"))
    if size is not None and size != cores:
        raise ValueError(f"topology {text} has {chips} chips, but {family.name}-{size} has "
                         f"{size // 2 if family.counts_cores else size}: write {family.name}-{cores} or "
                         f"leave the size out (name: tpu-{family.name})")
    return SliceShape(family, cores, text)


def all_slices() -> list[SliceShape]:
    return [SliceShape(f, n) for f in FAMILIES.values() for n in f.sizes]


def valid_sizes_message(text: str) -> str:
    """A hint listing the valid slices of the family the user seems to mean."""
    m = re.match(r"^(?:tpu-)?((?:v|tpu)\d+[a-z]*)-", text.strip().lower())
    name = m.group(1) if m else ""
    fam = FAMILIES.get(ALIASES.get(name, name))
    if fam is None:
        return "known families: " + ", ".join(FAMILIES)
    return f"valid {fam.name} slices: " + ", ".join(f"{fam.name}-{n}" for n in fam.sizes)
