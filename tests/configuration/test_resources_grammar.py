"""The resources grammar on its own: cpu, memory, disk, gpu specs and their normalized form."""

from __future__ import annotations

import pytest

from runs.configuration import ConfigurationError, parse_resources
from runs.configuration.gpu_spec import parse_gpu
from runs.configuration.resources import (
    DEFAULT_CPU_MIN,
    DEFAULT_DISK_MIN_GB,
    DEFAULT_MEMORY_MIN_GB,
    parse_cpu,
)


def test_an_empty_block_gets_the_documented_defaults() -> None:
    assert parse_resources(None).as_dict() == {
        "cpu": {"min": DEFAULT_CPU_MIN, "max": None, "arch": "x86"},
        "memory": {"min": DEFAULT_MEMORY_MIN_GB, "max": None},
        "disk": {"min": DEFAULT_DISK_MIN_GB, "max": None},
        "gpu": None,
        "shm_size": None,
    }


@pytest.mark.parametrize(
    ("written", "expected"),
    [
        (4, (4, 4, None)),
        ("4", (4, 4, None)),
        ("2..8", (2, 8, None)),
        ("2..", (2, None, None)),
        ("..8", (None, 8, None)),
        ("arm:8", (8, 8, "arm")),
        ("x86:4..", (4, None, "x86")),
        ("8:aarch64", (8, 8, "arm")),
        ("arm", (1, None, "arm")),
    ],
)
def test_cpu_forms(written: object, expected: tuple) -> None:
    assert parse_cpu(written) == expected


@pytest.mark.parametrize("written", ["8..2", "-1", "arm:x86:4", "4:8", "..", 2.5, True, "four", "²", "٣"])
def test_cpu_forms_that_are_rejected(written: object) -> None:
    with pytest.raises(ValueError):
        parse_cpu(written)


@pytest.mark.parametrize(
    ("written", "expected"),
    [
        ("16GB", {"min": 16.0, "max": 16.0}),
        ("16GB..", {"min": 16.0, "max": None}),
        ("..64GB", {"min": None, "max": 64.0}),
        ("512MB", {"min": 0.5, "max": 0.5}),
        ("1TB", {"min": 1024.0, "max": 1024.0}),
        ("1.5gb", {"min": 1.5, "max": 1.5}),
        (32, {"min": 32.0, "max": 32.0}),
        (0.5, {"min": 0.5, "max": 0.5}),
        ("100GB..2TB", {"min": 100.0, "max": 2048.0}),
    ],
)
def test_memory_and_disk_sizes(written: object, expected: dict) -> None:
    assert parse_resources({"memory": written}).as_dict()["memory"] == expected
    assert parse_resources({"disk": written}).as_dict()["disk"] == expected


@pytest.mark.parametrize(
    "written", ["64GB..16GB", "lots", "-4GB", "16XB", True, [16], float("nan"), float("inf"), 10**400, "²GB"]
)
def test_bad_sizes_point_at_their_key(written: object) -> None:
    with pytest.raises(ConfigurationError) as raised:
        parse_resources({"disk": written})
    assert [e["loc"] for e in raised.value.errors] == [["disk"]]


@pytest.mark.parametrize(
    ("written", "vendor", "names", "count", "memory", "tpu"),
    [
        ("L40S", "nvidia", ["L40S"], (1, 1), None, None),
        ("l40s", "nvidia", ["L40S"], (1, 1), None, None),
        ("L40S:2", "nvidia", ["L40S"], (2, 2), None, None),
        ("A100:80GB:8", "nvidia", ["A100"], (8, 8), (80.0, 80.0), None),
        ("8:80GB:A100", "nvidia", ["A100"], (8, 8), (80.0, 80.0), None),
        ("24GB:1..2", None, [], (1, 2), (24.0, 24.0), None),
        ("40GB..80GB:4", None, [], (4, 4), (40.0, 80.0), None),
        ("amd:MI300X:8", "amd", ["MI300X"], (8, 8), None, None),
        ("H100,A100:2..", "nvidia", ["H100", "A100"], (2, None), None, None),
        ("intel:Gaudi2", "intel", ["Gaudi2"], (1, 1), None, None),
        ("Z9000", None, ["Z9000"], (1, 1), None, None),
        (2, None, [], (2, 2), None, None),
        ("tpu-v2-32", "google", [], (4, 4), None, "v2-32"),
        ("v2-32", "google", [], (4, 4), None, "v2-32"),
        ("tpu:v2-32", "google", [], (4, 4), None, "v2-32"),
        ("google:v4-8", "google", [], (4, 4), None, "v4-8"),
        ("v5litepod-16", "google", [], (4, 4), None, "v5litepod-16"),
        ("v5e-4", "google", [], (4, 4), None, "v5litepod-4"),
        ("tpu:v6e-8", "google", [], (8, 8), None, "v6e-8"),
        ({"name": "H100", "count": 8}, "nvidia", ["H100"], (8, 8), None, None),
        (
            {"vendor": "amd", "name": ["MI300X", "MI325X"], "memory": "192GB.."},
            "amd",
            ["MI300X", "MI325X"],
            (1, 1),
            (192.0, None),
            None,
        ),
        ({"name": "v2-8"}, "google", [], (4, 4), None, "v2-8"),
    ],
)
def test_gpu_specs(
    written: object, vendor: str | None, names: list, count: tuple, memory: tuple | None, tpu: str | None
) -> None:
    gpu = parse_gpu(written)
    assert gpu.vendor == vendor
    assert gpu.names == names
    assert (gpu.count.min, gpu.count.max) == count
    assert (None if gpu.memory is None else (gpu.memory.min, gpu.memory.max)) == memory
    assert gpu.tpu == tpu


@pytest.mark.parametrize(
    ("written", "phrase"),
    [
        ("v2-12", "valid v2 slices"),
        ("tpu-v7-8", "known families"),
        ("tpu", "needs a slice name"),
        ("tpu-v2-32:4", "takes no name, count or memory"),
        ("amd:v2-8", "made by google"),
        ("nvidia:MI300X", "made by amd"),
        ("H100,MI300X", "mix vendors"),
        ("L40S:2..1", "greater than"),
        ("nvidia:amd:H100", "vendor twice"),
        ("H100:2:4", "count twice"),
        ("H100::2", "empty part"),
        ("H100:#", "cannot read"),
        ("", "gpu must be"),
        (True, "gpu must be"),
        (-1, "negative"),
    ],
)
def test_gpu_specs_that_are_rejected(written: object, phrase: str) -> None:
    with pytest.raises(ValueError, match=None) as raised:
        parse_gpu(written)
    assert phrase in str(raised.value)


def test_gpu_object_form_reports_each_bad_key_at_its_place() -> None:
    with pytest.raises(ConfigurationError) as raised:
        parse_resources({"gpu": {"vendor": "acme", "count": "x", "size": 1}})
    locs = sorted(tuple(e["loc"]) for e in raised.value.errors)
    assert locs == [("gpu", "count"), ("gpu", "size"), ("gpu", "vendor")]


def test_grace_gpus_move_the_cpu_to_arm_and_refuse_x86() -> None:
    assert parse_resources({"gpu": "GH200"}).cpu.arch == "arm"
    with pytest.raises(ConfigurationError) as raised:
        parse_resources({"gpu": "GB200:4", "cpu": "x86:16"})
    assert raised.value.errors[0]["loc"] == ["cpu"]
