"""What a GPU name tells us: its vendor and whether its hosts have ARM CPUs."""

from __future__ import annotations

import re

VENDORS = ("nvidia", "amd", "google", "intel")
# Vendor aliases a user may write in a gpu spec; `tpu` is how people say "a Google TPU".
VENDOR_ALIASES = {"nvidia": "nvidia", "amd": "amd", "google": "google", "intel": "intel", "tpu": "google"}

# fmt: off
_NAMES_BY_VENDOR: dict[str, tuple[str, ...]] = {
    "nvidia": (
        "B100", "B200", "GB200", "GH200", "H100", "H200", "A100", "A10G", "A10", "A30", "A40",
        "L4", "L40", "L40S", "T4", "V100", "P100", "P4", "K80",
        "RTX3090", "RTX4090", "RTX5090", "A4000", "A5000", "A6000", "RTX6000", "RTXPRO6000",
        "H100NVL", "H800", "H20", "A800", "L20", "B300", "GB300", "A2", "A16", "RTX3060", "RTX3080",
        "RTX4080", "RTX4000", "RTX5000", "RTXA4000", "RTXA5000", "RTXA6000", "RTX2080Ti", "P40",
    ),
    "amd": ("MI100", "MI210", "MI250", "MI250X", "MI300A", "MI300X", "MI308X", "MI325X", "MI355X"),
    "intel": ("Gaudi", "Gaudi2", "Gaudi3"),
}
# fmt: on

# Grace superchips pair the GPU with an ARM CPU, so their hosts need arm images.
ARM_GPU_NAMES = frozenset({"GB200", "GB300", "GH200"})


def name_key(name: str) -> str:
    """Compare names the way people write them: `l40s`, `L40S`, `RTX 4090` and `rtx-4090` agree."""
    return re.sub(r"[^0-9A-Z]", "", name.upper())


_KNOWN: dict[str, tuple[str, str]] = {
    name_key(name): (name, vendor) for vendor, names in _NAMES_BY_VENDOR.items() for name in names
}


def known_names() -> list[str]:
    return [name for name, _ in _KNOWN.values()]


def canonical_name(name: str) -> str:
    """The usual spelling of a known GPU name; an unknown name is kept as written."""
    known = _KNOWN.get(name_key(name))
    return known[0] if known else name.strip()


def vendor_of(name: str) -> str | None:
    known = _KNOWN.get(name_key(name))
    return known[1] if known else None


def needs_arm(names: list[str]) -> bool:
    return any(canonical_name(n) in ARM_GPU_NAMES for n in names)
