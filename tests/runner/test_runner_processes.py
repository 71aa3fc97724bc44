"""The runner driven through its CLI, with real agent, job-runner and job processes in a temp HOME."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .runner_helpers import (
    RUNNER_PATH,
    RUNNER_PYTHON,
    agent_pids,
    alive,
    cli,
    cli_json,
    group_members,
    job_spec,
    job_status,
    kill_everything,
    submit,
    wait_for,
    wait_state,
)

FINAL = ("done", "failed", "terminated", "max_duration_exceeded")


@pytest.fixture
def home(tmp_path: Path):
    home = tmp_path / "runner-home"
    home.mkdir()
    yield home
    kill_everything(home)


@pytest.fixture
def agent(home: Path):
    """An agent started directly (so the test owns the process) with a fast poll."""
    proc = subprocess.Popen(
        [RUNNER_PYTHON, str(RUNNER_PATH), "agent", "--home", str(home), "--poll", "0.05"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_for(lambda: (home / "agent.json").exists(), 5, "agent.json")
    yield proc
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def output(home: Path, job_id: str) -> bytes:
    return (home / "jobs" / job_id / "output.log").read_bytes()


def test_submitted_job_runs_to_done_with_output_and_exit_status(home, agent):
    spec = job_spec(
        "j1",
        ["echo hello", "pwd", 'cat "$DSTACK_MPI_HOSTFILE"', 'echo "rank=$DSTACK_NODE_RANK" >&2'],
        cluster_info={
            "job_ips": ["10.0.0.2", "10.0.0.3"],
            "master_job_ip": "10.0.0.2",
            "gpus_per_node": [0, 2],
        },
    )
    assert submit(home, "j1", spec) == {"submitted": True}

    status = wait_state(home, "j1", FINAL)

    assert status["state"] == "done"
    assert status["exit_status"] == 0
    assert status["end_time"] >= status["start_time"]
    workdir = home / "jobs" / "j1" / "workdir"
    assert output(home, "j1") == f"hello\n{workdir}\n10.0.0.2\n10.0.0.3 slots=2\nrank=0\n".encode()
    reported = cli_json(home, "status")["jobs"]["j1"]
    assert reported["state"] == "done"


def test_failing_command_fails_the_job_with_its_exit_status(home, agent):
    submit(home, "j1", job_spec("j1", ["echo before", "sh -c 'exit 7'", "echo after"]))

    status = wait_state(home, "j1", FINAL)

    assert (status["state"], status["exit_status"]) == ("failed", 7)
    assert output(home, "j1") == b"before\n"


def test_stop_terminates_the_job_and_its_whole_process_group(home, agent):
    submit(home, "j1", job_spec("j1", ["sleep 60 &", "sleep 60"]))
    running = wait_state(home, "j1", ("running",))
    wait_for(lambda: len(group_members(running["pgid"])) >= 3, 5, "shell and both sleeps")

    assert cli_json(home, "stop", "--job", "j1") == {"stopping": True}
    status = wait_state(home, "j1", FINAL)

    assert status["state"] == "terminated"
    assert status["signal"] == signal.SIGTERM
    assert group_members(running["pgid"]) == []


def test_max_duration_kills_a_long_job(home, agent):
    submit(home, "j1", job_spec("j1", ["echo started", "sleep 60"], max_duration=1))
    running = wait_state(home, "j1", ("running",))

    status = wait_state(home, "j1", FINAL, timeout=10)

    assert status["state"] == "max_duration_exceeded"
    assert group_members(running["pgid"]) == []
    assert output(home, "j1") == b"started\n"


def test_job_that_ignores_sigterm_is_killed_after_the_stop_grace(home, agent):
    submit(home, "j1", job_spec("j1", ["trap '' TERM", "sleep 60"], stop_grace=0.5))
    running = wait_state(home, "j1", ("running",))

    cli_json(home, "stop", "--job", "j1")
    status = wait_state(home, "j1", FINAL)

    assert status["state"] == "terminated"
    assert group_members(running["pgid"]) == []


def test_background_server_does_not_outlive_its_job(home, agent):
    server = f"{sys.executable} -m http.server 0 --bind 127.0.0.1 >/dev/null 2>&1 &"
    submit(home, "j1", job_spec("j1", [server, "echo $! > server.pid", "sleep 1"]))

    status = wait_state(home, "j1", FINAL)

    assert status["state"] == "done"
    server_pid = int((home / "jobs" / "j1" / "workdir" / "server.pid").read_text())
    assert not alive(server_pid)
    assert group_members(status["pgid"]) == []


def test_ensure_agent_called_concurrently_and_again_leaves_exactly_one_agent(home):
    command = [RUNNER_PYTHON, str(RUNNER_PATH), "ensure-agent", "--home", str(home)]
    callers = [subprocess.Popen(command, stdout=subprocess.PIPE) for _ in range(2)]
    replies = [json.loads(caller.communicate(timeout=15)[0]) for caller in callers]

    again = cli_json(home, "ensure-agent")

    pids = {reply["pid"] for reply in replies} | {again["pid"]}
    assert len(pids) == 1
    assert sorted(reply["started"] for reply in replies) == [False, True]
    assert again["started"] is False
    assert agent_pids(home) == [again["pid"]]


def test_ensure_agent_returns_while_the_detached_agent_keeps_running(home):
    # SSH waits for every holder of the session's stdout; a detached agent must not hold it.
    started = time.monotonic()
    reply = json.loads(
        subprocess.run(
            [RUNNER_PYTHON, str(RUNNER_PATH), "ensure-agent", "--home", str(home)],
            capture_output=True,
            timeout=10,
            check=True,
        ).stdout
    )
    assert time.monotonic() - started < 8
    assert reply["started"] is True
    assert agent_pids(home) == [reply["pid"]]
    assert os.getsid(reply["pid"]) == reply["pid"]


def test_detached_agent_runs_jobs(home):
    cli_json(home, "ensure-agent")
    submit(home, "j1", job_spec("j1", ["echo via-ensure"]))
    assert wait_state(home, "j1", FINAL)["state"] == "done"
    assert output(home, "j1") == b"via-ensure\n"


def test_status_reports_the_agent_dead_after_it_is_killed(home, agent):
    assert wait_for(lambda: cli_json(home, "status")["agent_alive"], 5, "agent alive")

    agent.kill()
    agent.wait()

    status = cli_json(home, "status")
    assert status["agent_alive"] is False
    assert status["agent"]["pid"] == agent.pid
    replacement = cli_json(home, "ensure-agent")
    assert replacement["started"] is True
    assert replacement["pid"] != agent.pid


def test_agent_exits_cleanly_on_sigterm(home, agent):
    agent.send_signal(signal.SIGTERM)
    assert agent.wait(5) == 0
    assert cli_json(home, "status")["agent_alive"] is False


def test_agent_exits_when_the_stop_file_appears(home, agent):
    (home / "agent.stop").touch()
    assert agent.wait(5) == 0
    # A later ensure-agent must not be defeated by the old stop request.
    assert cli_json(home, "ensure-agent")["started"] is True


def test_a_second_agent_on_the_same_home_exits_at_once(home, agent):
    second = subprocess.run(
        [RUNNER_PYTHON, str(RUNNER_PATH), "agent", "--home", str(home)], capture_output=True, timeout=5
    )
    assert second.returncode == 0
    assert agent_pids(home) == [agent.pid]


def test_submit_is_idempotent_and_keeps_the_first_spec(home):
    first = job_spec("j1", ["echo first"])
    assert submit(home, "j1", first) == {"submitted": True}
    assert submit(home, "j1", first) == {"submitted": False}

    assert json.loads((home / "jobs" / "j1" / "spec.json").read_text()) == first
    assert cli_json(home, "status")["jobs"] == {"j1": {"state": "submitted", "log_size": 0}}


def test_submit_of_an_existing_job_id_with_another_spec_is_an_error(home):
    first = job_spec("j1", ["echo first"])
    assert submit(home, "j1", first) == {"submitted": True}

    clash = cli(home, "submit", "--job", "j1", stdin=json.dumps(job_spec("j1", ["echo second"])).encode())

    assert clash.returncode != 0
    assert "different spec" in json.loads(clash.stdout)["error"]
    assert json.loads((home / "jobs" / "j1" / "spec.json").read_text()) == first


def test_submit_refuses_a_spec_that_is_not_json(home):
    result = cli(home, "submit", "--job", "j1", stdin=b"{not json")
    assert result.returncode != 0
    assert json.loads(result.stdout)["submitted"] is False
    assert not (home / "jobs" / "j1" / "spec.json").exists()


def test_log_returns_raw_bytes_from_an_offset_up_to_a_limit(home):
    job_dir = home / "jobs" / "j1"
    job_dir.mkdir(parents=True)
    data = b"0123456789\xff\x00\xfe tail"
    (job_dir / "output.log").write_bytes(data)

    assert cli(home, "log", "--job", "j1").stdout == data
    assert cli(home, "log", "--job", "j1", "--offset", "3", "--limit", "4").stdout == b"3456"
    assert cli(home, "log", "--job", "j1", "--offset", "10").stdout == b"\xff\x00\xfe tail"
    assert cli(home, "log", "--job", "j1", "--offset", "1000").stdout == b""


def test_status_says_how_much_each_job_has_printed_so_the_server_fetches_only_what_is_new(home):
    first = job_spec("j1", ["echo first"])
    assert submit(home, "j1", first) == {"submitted": True}
    (home / "jobs" / "j1" / "output.log").write_bytes(b"0123456789")
    assert cli_json(home, "status")["jobs"]["j1"]["log_size"] == 10


def test_log_of_a_job_without_output_is_empty(home):
    result = cli(home, "log", "--job", "nothing-yet")
    assert (result.returncode, result.stdout) == (0, b"")


def test_a_bad_spec_fails_that_job_and_the_agent_keeps_serving(home, agent):
    bad = home / "jobs" / "bad"
    bad.mkdir(parents=True)
    (bad / "spec.json").write_text("{ truncated")
    old = time.time() - 60  # past the settling time given to specs still being copied
    os.utime(bad / "spec.json", (old, old))
    submit(home, "good", job_spec("good", ["echo fine"]))

    assert wait_state(home, "bad", FINAL)["state"] == "failed"
    assert "bad spec" in job_status(home, "bad")["error"]
    assert wait_state(home, "good", FINAL)["state"] == "done"
    assert agent.poll() is None


def test_a_job_stopped_before_it_starts_never_runs(home, agent):
    agent.terminate()
    agent.wait()
    submit(home, "j1", job_spec("j1", ["touch ran"]))
    cli_json(home, "stop", "--job", "j1")

    cli_json(home, "ensure-agent")

    assert wait_state(home, "j1", FINAL)["state"] == "terminated"
    assert not (home / "jobs" / "j1" / "workdir" / "ran").exists()


def test_a_job_whose_runner_dies_is_failed_and_its_processes_killed(home, agent):
    submit(home, "j1", job_spec("j1", ["sleep 60"]))
    running = wait_state(home, "j1", ("running",))

    os.kill(running["runner_pid"], signal.SIGKILL)
    status = wait_state(home, "j1", FINAL)

    assert status["state"] == "failed"
    assert "job runner" in status["error"]
    assert group_members(running["pgid"]) == []


def test_jobs_survive_an_agent_restart_and_are_not_started_twice(home, agent):
    submit(home, "j1", job_spec("j1", [f"echo once >> '{home}/runs'", "sleep 1"]))
    wait_state(home, "j1", ("running",))
    agent.terminate()
    agent.wait()

    cli_json(home, "ensure-agent")

    assert wait_state(home, "j1", FINAL)["state"] == "done"
    assert (home / "runs").read_text() == "once\n"


def test_cleanup_refuses_a_running_job_and_removes_a_finished_one(home, agent):
    submit(home, "j1", job_spec("j1", ["sleep 60"]))
    wait_state(home, "j1", ("running",))

    assert cli_json(home, "cleanup", "--job", "j1")["removed"] is False
    assert (home / "jobs" / "j1").is_dir()

    cli_json(home, "stop", "--job", "j1")
    wait_state(home, "j1", FINAL)
    assert cli_json(home, "cleanup", "--job", "j1") == {"removed": True}
    assert not (home / "jobs" / "j1").exists()
    assert cli_json(home, "status")["jobs"] == {}


def test_stop_of_an_unknown_job_is_reported(home):
    assert cli_json(home, "stop", "--job", "missing")["stopping"] is False
    assert not (home / "jobs" / "missing").exists()


def test_a_retired_home_keeps_no_agent_and_only_a_revive_starts_one(home):
    """The server retires a home when its instance is deleted. An ensure-agent that passed its check
    a moment before may already have started an agent: that agent exits when it sees the home retired."""
    first = cli_json(home, "ensure-agent")
    (home / "retired").touch()
    wait_for(lambda: not agent_pids(home), 10, "the agent to leave its retired home")
    refused = cli(home, "ensure-agent")
    assert refused.returncode != 0 and "retired" in json.loads(refused.stdout)["error"]
    assert agent_pids(home) == []
    revived = cli_json(home, "ensure-agent", "--revive")
    assert revived["started"] is True and revived["pid"] != first["pid"]
    assert not (home / "retired").exists()
    assert agent_pids(home) == [revived["pid"]]
