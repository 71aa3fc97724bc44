"""The TPU slice-shape table: the one place that knows how a slice name maps to hosts and chips.

Used by the configuration language (to expand `gpu: v2-32` into 4 nodes and reject unknown
slices), by the gcp backend (offers and provisioning) and by the docs.
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
    accelerator_config_type: str  # the TPU API's AcceleratorConfig.Type
    default_runtime_version: str


def _powers_of_two(lo: int, hi: int) -> tuple[int, ...]:
    out, n = [], lo
    while n <= hi:
        out.append(n)
        n *= 2
    return tuple(out)


FAMILIES: dict[str, TpuFamily] = {
    f.name: f
    for f in (
        TpuFamily("v2", True, (8, 32, 128, 256, 512), 16, "V2", "tpu-ubuntu2204-base"),
        TpuFamily("v3", True, (8, 32, 64, 128, 256, 512, 1024, 2048), 32, "V3", "tpu-ubuntu2204-base"),
        TpuFamily("v4", True, _powers_of_two(8, 4096), 32, "V4", "tpu-ubuntu2204-base"),
        TpuFamily("v5p", True, _powers_of_two(8, 8192), 95, "V5P", "v2-alpha-tpuv5"),
        TpuFamily("v5litepod", False, (1, 4, 8, 16, 32, 64, 128, 256), 16, "V5LITE_POD", "v2-alpha-tpuv5-lite"),
        TpuFamily("v6e", False, (1, 4, 8, 16, 32, 64, 128, 256), 32, "V6E", "v2-alpha-tpuv6e"),
    )
}

# The port of a multislice set's (megascale) coordinator on slice 0 worker 0, as Google's queued
# resources and Ray set it; jax.distributed strips it and uses its own port (8482) on that host.
MEGASCALE_PORT = 8081

_SLICE_RE = re.compile(r"^(?:tpu-)?(v2|v3|v4|v5p|v5litepod|v5e|v6e)-(\d+)$")


@dataclass(frozen=True)
class SliceShape:
    family: TpuFamily
    size: int

    @property
    def name(self) -> str:
        return f"{self.family.name}-{self.size}"

    @property
    def chips(self) -> int:
        return self.size // 2 if self.family.counts_cores else self.size

    @property
    def hosts(self) -> int:
        if self.family.counts_cores:
            return max(1, self.size // 8)
        return 1 if self.size <= 8 else self.size // 4

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
    return bool(re.match(r"^(?:tpu-)?v\d+[a-z]*-\d+$", text.strip().lower()))


def parse_slice(text: str) -> SliceShape | None:
    """`v2-32`, `tpu-v2-32` or `v5e-8` (alias of v5litepod) -> SliceShape; None when unknown."""
    m = _SLICE_RE.match(text.strip().lower())
    if not m:
        return None
    family_name = "v5litepod" if m.group(1) == "v5e" else m.group(1)
    family = FAMILIES[family_name]
    size = int(m.group(2))
    if size not in family.sizes:
        return None
    return SliceShape(family, size)


def all_slices() -> list[SliceShape]:
    return [SliceShape(f, n) for f in FAMILIES.values() for n in f.sizes]


def valid_sizes_message(text: str) -> str:
    """A hint listing the valid slices of the family the user seems to mean."""
    m = re.match(r"^(?:tpu-)?(v\d+[a-z]*)-", text.strip().lower())
    fam = FAMILIES.get("v5litepod" if m and m.group(1) == "v5e" else (m.group(1) if m else ""))
    if fam is None:
        return "known families: " + ", ".join(FAMILIES)
    return f"valid {fam.name} slices: " + ", ".join(f"{fam.name}-{n}" for n in fam.sizes)
