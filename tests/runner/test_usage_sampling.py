"""The runner's GPU reader against nvidia-smi programs that misbehave: endless output, a hang, junk.
Each is a real program on PATH; the reader must come back with what it could parse, never more."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from runner import usage


@pytest.fixture
def nvidia_smi(tmp_path, monkeypatch):
    def install(body: str) -> None:
        script = tmp_path / "nvidia-smi"
        script.write_text("#!/bin/sh\n" + body)
        script.chmod(0o755)
        monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")

    return install


def test_endless_output_is_read_up_to_the_cap_and_at_most_max_gpus_are_kept(nvidia_smi):
    nvidia_smi("yes '0, 50, 10, 20'\n")
    gpus = usage.gpu_usage()
    assert len(gpus) == usage.MAX_GPUS
    assert gpus[0] == {"index": 0, "util_percent": 50.0, "memory_used_bytes": 10 * usage.MIB,
                       "memory_total_bytes": 20 * usage.MIB}


def test_a_hanging_nvidia_smi_and_its_children_are_killed_and_give_no_gpus(nvidia_smi, monkeypatch):
    monkeypatch.setattr(usage, "NVIDIA_SMI_TIMEOUT", 0.5)
    nvidia_smi("echo '0, 1,'\nsleep 600 &\nsleep 600\n")  # a child holds the pipe open too
    assert usage.gpu_usage() == []


def test_junk_lines_are_skipped_and_values_that_are_no_numbers_are_none(nvidia_smi):
    nvidia_smi("printf '0, 12, 100, 200\\n\\377\\376 binary\\n1, inf, nan, 1e999\\n2.5, 1, 1, 1\\n, , ,\\n'\n")
    assert usage.gpu_usage() == [
        {"index": 0, "util_percent": 12.0, "memory_used_bytes": 100 * usage.MIB, "memory_total_bytes": 200 * usage.MIB},
        {"index": 1, "util_percent": None, "memory_used_bytes": None, "memory_total_bytes": None},
    ]


def test_without_nvidia_smi_there_are_no_gpus(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert usage.gpu_usage() == []


def test_status_leaves_out_a_usage_file_larger_than_a_sample_can_be(tmp_path):
    # the job may write its own directory: a huge usage.json must not make its host's status too
    # large to read (the server would take the host for unreachable)
    from runner.commands import status_report
    from runner.files import Paths

    paths = Paths(str(tmp_path / "home"))
    small, big = paths.job("small"), paths.job("big")
    for job in (small, big):
        Path(job.dir).mkdir(parents=True)
        Path(job.status).write_text('{"state": "running"}')
    Path(usage.usage_path(small)).write_text('{"t": 1, "cpu_percent": 5}')
    Path(usage.usage_path(big)).write_text('{"t": 1, "junk": "' + "x" * usage.USAGE_FILE_CAP + '"}')
    jobs = status_report(paths)["jobs"]
    assert jobs["small"]["usage"] == {"t": 1, "cpu_percent": 5}
    assert "usage" not in jobs["big"]
