"""The normalized, JSON-safe form of a resources block: what the engine matches hosts against.

Kept apart from the grammar that produces it (`resources`, `gpu_spec`) because the engine, the
task and fleet models and the matcher all read this form and none of them needs the parser.
Ranges are inclusive; a missing bound is None.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from backends.registry import SliceShape, parse_slice

CpuArch = Literal["x86", "arm"]
GpuVendor = Literal["nvidia", "amd", "google", "intel"]


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class IntRange(_Frozen):
    min: int | None
    max: int | None


class SizeRange(_Frozen):
    """A size in GB."""

    min: float | None
    max: float | None


class CpuRequirement(_Frozen):
    min: int | None
    max: int | None
    arch: CpuArch


class GpuRequirement(_Frozen):
    vendor: GpuVendor | None
    names: list[str]
    count: IntRange
    memory: SizeRange | None
    tpu: str | None  # canonical slice name, e.g. v2-32
    total_memory: SizeRange | None = None  # GB over the node's GPUs
    compute_capability: str | None = None  # e.g. "8.0"

    def tpu_shape(self) -> SliceShape | None:
        return parse_slice(self.tpu) if self.tpu else None


class Resources(_Frozen):
    cpu: CpuRequirement
    memory: SizeRange
    disk: SizeRange
    gpu: GpuRequirement | None
    shm_size: float | None = None  # GB; the container's /dev/shm (jobs with `image`)

    def as_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


