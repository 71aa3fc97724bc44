"""The local backend's runner host calls the job verbs in the server's process: the same answers,
refusals and file modes as the zipapp's CLI, and no Python process started per call."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from backends.base import BackendError
from backends.local.runner_host import LocalRunnerHost
from tests.runner.runner_helpers import job_spec, wait_state
from tests.runner.test_runner_processes import agent, home  # noqa: F401 - fixtures

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def no_subprocess(monkeypatch):
    """Any Python process a verb would start fails the test (ensure-agent is not under test here)."""
    started: list[object] = []

    def refuse(*args, **kwargs):
        started.append(args[0] if args else kwargs.get("args"))
        raise AssertionError(f"a verb started a process: {started[-1]}")

    monkeypatch.setattr(subprocess, "run", refuse)
    monkeypatch.setattr(subprocess, "Popen", refuse)
    return started


def test_a_job_runs_submit_to_cleanup_without_a_process_per_call(home, agent, no_subprocess):  # noqa: F811
    # the agent (started by its fixture, before processes are refused) runs the job
    host = LocalRunnerHost(home)
    host.submit("j1", job_spec("j1", ["echo hello from j1"]))
    wait_state(home, "j1", ("done",))
    assert host.status()["jobs"]["j1"]["state"] == "done"
    assert host.read_log("j1") == b"hello from j1\n"
    assert host.read_log("j1", offset=6, limit=4) == b"from"
    host.stop("j1")  # a finished job: asking it to stop is harmless
    host.cleanup("j1")
    assert not (home / "jobs" / "j1").exists()
    assert no_subprocess == []


def test_a_spec_written_by_the_server_is_private_whatever_the_servers_umask(home, no_subprocess):  # noqa: F811
    old = os.umask(0o022)
    try:
        LocalRunnerHost(home).submit("j1", job_spec("j1", ["true"], env={"TOKEN": "s3cret"}))
    finally:
        os.umask(old)
    job_dir = home / "jobs" / "j1"
    assert stat.S_IMODE(job_dir.stat().st_mode) == 0o700
    assert sorted(p.name for p in job_dir.iterdir()) == ["spec.json", "spec.sha256"]
    for path in job_dir.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def test_a_second_submit_with_another_spec_is_refused_as_the_cli_refuses_it(home, no_subprocess):  # noqa: F811
    host = LocalRunnerHost(home)
    first = job_spec("j1", ["echo first"])
    host.submit("j1", first)
    host.submit("j1", first)  # the same spec again: idempotent

    with pytest.raises(BackendError, match="different spec"):
        host.submit("j1", job_spec("j1", ["echo second"]))
    assert json.loads((home / "jobs" / "j1" / "spec.json").read_text()) == first


@pytest.mark.parametrize("job_id", ["../escape", "a/b", "", "."])
def test_a_job_id_that_leaves_the_home_is_a_backend_error(home, no_subprocess, job_id):  # noqa: F811
    host = LocalRunnerHost(home)
    for call in (lambda: host.submit(job_id, job_spec("x", ["true"])), lambda: host.stop(job_id),
                 lambda: host.read_log(job_id), lambda: host.cleanup(job_id)):
        with pytest.raises(BackendError):
            call()
    assert sorted(p.name for p in Path(home).iterdir()) == []


def test_a_stop_or_cleanup_of_an_unknown_job_is_no_error(home, no_subprocess):  # noqa: F811
    host = LocalRunnerHost(home)
    host.stop("nothing-here")
    host.cleanup("nothing-here")
    assert host.read_log("nothing-here") == b""
