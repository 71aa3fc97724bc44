"""What a job may see and leave behind on its host: environment, file modes, escaped processes.

Driven through the runner's CLI with real agents and job processes, as the server drives it.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from .runner_helpers import (
    RUNNER_PATH,
    RUNNER_PYTHON,
    cli,
    cli_json,
    escape_commands,
    escaped_processes,
    free_port,
    job_spec,
    kill_escapes,
    kill_everything,
    load_runner_module,
    nothing_of_the_job_left,
    submit,
    wait_for,
    wait_state,
)

FINAL = ("done", "failed", "terminated", "max_duration_exceeded")
mr = load_runner_module()


@pytest.fixture
def home(tmp_path: Path):
    home = tmp_path / "runner-home"
    yield home
    (home / "agent.stop").touch() if home.is_dir() else None
    kill_everything(home)


def ensure_agent(home: Path, env: dict[str, str]) -> dict:
    """ensure-agent as the server calls it: a process with the caller's (here: a worker's) environment."""
    done = subprocess.run(
        [RUNNER_PYTHON, str(RUNNER_PATH), "ensure-agent", "--home", str(home)],
        env=env, capture_output=True, timeout=15, check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    return json.loads(done.stdout)


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().rstrip(b"\0")
    return dict(item.decode().split("=", 1) for item in raw.split(b"\0") if b"=" in item)


@pytest.fixture
def worker_env():
    """What a production worker has in its environment and no job may inherit."""
    return {**os.environ, "SECRET_KEY": "worker-signing-key", "DATABASE_URL": "postgres://u:pw@db/muster"}


def test_agent_job_runner_and_job_never_inherit_the_callers_environment(home, worker_env):
    pid = ensure_agent(home, worker_env)["pid"]
    submit(home, "j1", job_spec("j1", ["env > env.txt", "sleep 30"], env={"MY_VAR": "mine"}))
    running = wait_state(home, "j1", ("running",))
    env_file = home / "jobs" / "j1" / "workdir" / "env.txt"
    wait_for(lambda: env_file.exists() and env_file.read_text().endswith("\n"), 5, "env.txt")

    job_env = dict(line.split("=", 1) for line in env_file.read_text().splitlines() if "=" in line)
    for process_env in (environ_of(pid), environ_of(running["runner_pid"]), job_env):
        assert "SECRET_KEY" not in process_env and "DATABASE_URL" not in process_env, process_env
    assert job_env["MY_VAR"] == "mine"
    assert job_env["DSTACK_RUN_NAME"] == "test-run"
    assert job_env["HOME"] and job_env["PATH"] and job_env["LANG"]
    assert job_env["MUSTER_JOB_ID"] == "j1"
    assert job_env["MUSTER_HOME"] == os.path.abspath(home)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_homes_job_directories_and_files_are_private_and_secret_values_leave_the_spec(home, worker_env):
    home.mkdir(mode=0o755)  # as a server or an installer with umask 022 would make it
    os.chmod(home, 0o755)
    ensure_agent(home, worker_env)
    spec = job_spec("j1", ['echo "token is $HF_TOKEN" > seen.txt', "echo out", "sleep 30"],
                    env={"HF_TOKEN": "hf_secret_value", "PLAIN": "x"})
    submit(home, "j1", spec)
    wait_state(home, "j1", ("running",))
    job_dir = home / "jobs" / "j1"
    seen = job_dir / "workdir" / "seen.txt"
    wait_for(lambda: seen.exists() and seen.read_text().endswith("\n"), 5, "seen.txt")

    assert seen.read_text() == "token is hf_secret_value\n"  # the job itself still gets the value
    on_disk = (job_dir / "spec.json").read_text()
    assert "hf_secret_value" not in on_disk
    assert json.loads(on_disk)["env"] == {"HF_TOKEN": None, "PLAIN": None}
    for directory in (home, home / "jobs", job_dir, job_dir / "workdir", job_dir / "mpi"):
        assert mode(directory) == 0o700, directory
    for file in (job_dir / "spec.json", job_dir / "status.json", job_dir / "output.log",
                 job_dir / "mpi" / "hostfile", seen, home / "agent.json", home / "agent.log"):
        assert mode(file) & 0o077 == 0, (file, oct(mode(file)))
    # The same spec again is still the same job, although the copy on disk lost its values.
    assert submit(home, "j1", spec) == {"submitted": False}


@pytest.fixture
def escapes():
    token = f"esc-{uuid.uuid4().hex[:12]}"
    ports = (free_port(), free_port())
    yield token, ports
    kill_escapes(token, ports)


CGROUPS = mr.cgroup_parent() is not None


@pytest.mark.parametrize("cgroup", [
    pytest.param(True, marks=pytest.mark.skipif(not CGROUPS, reason="no writable cgroup hierarchy here")),
    pytest.param(False, id="marker-only"),
])
@pytest.mark.parametrize("ending", ["done", "stop", "max_duration"])
def test_no_process_of_a_job_outlives_it_whatever_group_or_session_it_left_for(
        home, worker_env, escapes, ending, cgroup):
    token, ports = escapes
    ensure_agent(home, worker_env)
    # "done": the job ends once the test has seen its escapes up (the commands alone could end,
    # and their group be killed, before a loaded machine let the test look)
    commands = escape_commands(token, ports) + (
        ["while [ ! -e escapes-seen ]; do sleep 0.1; done"] if ending == "done" else ["sleep 600"])
    spec = job_spec("j1", commands, max_duration=3 if ending == "max_duration" else None, cgroup=cgroup)
    submit(home, "j1", spec)
    wait_for(lambda: len(escaped_processes(token, ports)) >= 3, 30, "the escapes to be up")
    if ending == "done":
        (home / "jobs" / "j1" / "workdir" / "escapes-seen").touch()
    if ending == "stop":
        cli_json(home, "stop", "--job", "j1")

    status = wait_state(home, "j1", FINAL, timeout=30)

    assert status["state"] == {"done": "done", "stop": "terminated", "max_duration": "max_duration_exceeded"}[ending]
    assert bool(status["cgroup"]) is cgroup
    assert escaped_processes(token, ports) == []
    assert nothing_of_the_job_left(token, ports)
    assert not status["cgroup"] or not os.path.exists(status["cgroup"]), "the job's cgroup is removed"


@pytest.mark.skipif(not CGROUPS, reason="no writable cgroup hierarchy here")
def test_with_a_cgroup_even_a_process_that_drops_the_marker_is_stopped(home, worker_env, escapes):
    token, ports = escapes
    ensure_agent(home, worker_env)
    sleeper = f"{sys.executable} -c 'import time; time.sleep(600)' {token}-unmarked"
    submit(home, "j1", job_spec("j1", [f"env -u MUSTER_JOB_ID setsid {sleeper} > /dev/null 2>&1 &", "sleep 600"]))
    running = wait_state(home, "j1", ("running",))
    wait_for(lambda: escaped_processes(token, ports), 30, "the unmarked sleeper")
    assert os.path.isdir(running["cgroup"])

    cli_json(home, "stop", "--job", "j1")
    wait_state(home, "j1", FINAL, timeout=30)

    assert escaped_processes(token, ports) == []
    assert not os.path.exists(running["cgroup"])


def test_cleanup_of_a_job_whose_runner_died_kills_what_escaped_its_group(home, worker_env, escapes):
    token, ports = escapes
    ensure_agent(home, worker_env)
    submit(home, "j1", job_spec("j1", escape_commands(token, ports) + ["sleep 600"]))
    running = wait_state(home, "j1", ("running",))
    wait_for(lambda: len(escaped_processes(token, ports)) >= 3, 30, "the escapes to be up")
    (home / "agent.stop").touch()
    os.kill(running["runner_pid"], 9)
    os.killpg(running["pgid"], 9)  # the job's own group dies with its runner; the escapes do not

    assert cli_json(home, "cleanup", "--job", "j1") == {"removed": True}

    assert escaped_processes(token, ports) == []
    assert nothing_of_the_job_left(token, ports)


@pytest.mark.parametrize("cgroup", [
    pytest.param(True, marks=pytest.mark.skipif(not CGROUPS, reason="no writable cgroup hierarchy here")),
    pytest.param(False, id="marker-only"),
])
def test_stopping_a_job_leaves_the_same_job_id_in_another_home_alone(tmp_path, worker_env, cgroup):
    homes = [tmp_path / "a", tmp_path / "b"]
    try:
        for home in homes:
            ensure_agent(home, worker_env)
            submit(home, "j1", job_spec("j1", ["setsid sleep 600 &", "sleep 600"], cgroup=cgroup))
        other = wait_state(homes[1], "j1", ("running",))
        wait_state(homes[0], "j1", ("running",))

        cli_json(homes[0], "stop", "--job", "j1")

        assert wait_state(homes[0], "j1", FINAL)["state"] == "terminated"
        assert (mr.job_status(mr.Paths(str(homes[1])).job("j1")) or {}).get("state") == "running"
        assert mr.is_runner_process(other["runner_pid"], "job", "j1")
        assert len(mr.marked_pids(mr.Paths(str(homes[1])).job("j1").marker)) == 3  # shell and both sleeps
    finally:
        for home in homes:
            (home / "agent.stop").touch()
            cli(home, "stop", "--job", "j1")
            wait_state(home, "j1", FINAL)
            kill_everything(home)
