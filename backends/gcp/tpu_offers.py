"""What a gcp fleet offers: one offer per TPU slice shape, with a host's resources and a rough price.

No API call: offers come from the shape table, so planning a run never needs credentials.
"""

from __future__ import annotations

from typing import Any

from backends.base import InstanceOffer
from backends.gcp.tpu_client import TpuConfig
from backends.gcp.tpu_shapes import SliceShape, all_slices

# Rough TPU VM host shapes (vCPUs, memory GB) from Google's public docs; v5e and v6e hosts differ
# with the number of chips they carry.
_HOST_SHAPES: dict[str, dict[int, tuple[int, int]]] = {
    "v2": {4: (96, 334)},
    "v3": {4: (96, 340)},
    "v4": {4: (240, 407)},
    "v5p": {4: (208, 448)},
    "v5litepod": {1: (24, 48), 4: (112, 192), 8: (224, 384)},
    "v6e": {1: (44, 176), 4: (180, 720), 8: (180, 1440)},
    "tpu7x": {4: (224, 960)},  # cloud.google.com/tpu/docs/tpu7x: "4-chip VM", 224 vCPUs, 960 GB
}
# Rough, indicative on-demand USD per chip-hour (us-central list prices, 2024); only used to rank
# offers, never to bill. Spot is roughly a third of it.
# tpu7x has no public list price (access goes through an account team): it ranks after v5p.
_CHIP_HOUR_USD = {"v2": 1.125, "v3": 2.0, "v4": 3.22, "v5p": 4.2, "v5litepod": 1.2, "v6e": 2.7, "tpu7x": 6.0}
_SPOT_FACTOR = 0.35


def host_resources(shape: SliceShape) -> dict[str, Any]:
    """What one host of this slice offers (every host of a slice is identical)."""
    cpus, memory_gb = _HOST_SHAPES[shape.family.name][shape.chips_per_host]
    return {
        "cpus": cpus,
        "memory_gb": memory_gb,
        "disk_gb": 100,
        "cpu_arch": "x86",
        "gpus": [],
        "tpu": shape.name,
        "tpu_chips": shape.chips_per_host,
        "hbm_gb": shape.hbm_gb_per_host,
    }


def slice_offers(cfg: TpuConfig, shapes: list[SliceShape] | None = None) -> list[InstanceOffer]:
    """One offer per slice of the shape table (or per slice given: one with an explicit topology is
    in no table); `price` is for the whole slice per hour."""
    factor = _SPOT_FACTOR if cfg.spot else 1.0
    return [
        InstanceOffer(
            backend="gcp",
            region=_region(cfg.zones[0]),
            instance_type=shape.name,
            resources=host_resources(shape),
            price=round(shape.chips * _CHIP_HOUR_USD[shape.family.name] * factor, 4),
            hosts=shape.hosts,
            zones=list(cfg.zones),
        )
        for shape in (all_slices() if shapes is None else shapes)
    ]


def _region(zone: str) -> str:
    # "us-central2-b" -> "us-central2"
    return zone.rsplit("-", 1)[0] if zone.count("-") >= 2 else zone
