"""Readiness probes run by the job runner itself, reported by `status` with the job (runner/probes.py).

Driven through the zipapp's CLI with a real agent, as the server drives it: each probe kind against
something real on 127.0.0.1 (an HTTP server the job starts late, a port nobody listens on, a file
the job creates), and the streaks, errors and `until_ready` as `status` prints them.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from .runner_helpers import (
    RUNNER_PATH,
    RUNNER_PYTHON,
    cli,
    cli_json,
    free_port,
    job_spec,
    kill_everything,
    submit,
    wait_for,
    wait_state,
)


@pytest.fixture
def home(tmp_path: Path):
    home = tmp_path / "runner-home"
    home.mkdir()
    yield home
    kill_everything(home)


@pytest.fixture
def agent(home: Path):
    proc = subprocess.Popen([RUNNER_PYTHON, str(RUNNER_PATH), "agent", "--home", str(home), "--poll", "0.05"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: (home / "agent.json").exists(), 5, "agent.json")
    yield proc
    proc.terminate()
    proc.wait(5)


def probe(**fields) -> dict:
    return {"type": "http", "url": "/", "method": "get", "headers": [], "body": None, "port": None,
            "command": None, "interval": 1, "timeout": 1, "ready_after": 1, "until_ready": False, **fields}


def probes_of(home: Path, job_id: str) -> list[dict] | None:
    return cli_json(home, "status")["jobs"].get(job_id, {}).get("probes")


def test_probes_report_streaks_and_errors_of_each_kind(home, agent):
    web, closed = free_port(), free_port()
    # the server comes up two seconds after the job starts: the http probe fails first, then passes
    commands = [f"(sleep 2; exec python3 -m http.server {web} --bind 127.0.0.1) &", "sleep 1; touch loaded",
                "sleep 60"]
    spec = job_spec("p1", commands, probes=[
        probe(port=web, url="/", ready_after=2),
        probe(type="tcp", port=closed),
        probe(type="exec", command=["test", "-f", "loaded"], url=None, method=None),
    ])
    assert submit(home, "p1", spec)["submitted"] is True
    wait_state(home, "p1", ("running",))
    early = wait_for(lambda: (p := probes_of(home, "p1")) and all(r["calls"] for r in p) and p, 10, "first calls")
    assert early[0]["success_streak"] == 0 and early[0]["last_error"], early
    got = wait_for(lambda: (p := probes_of(home, "p1")) and p[0]["success_streak"] >= 2
                   and p[2]["success_streak"] >= 1 and p, 20, "the http and exec probes to pass")
    assert got[0]["last_error"] is None
    assert got[1]["success_streak"] == 0 and "Connection refused" in got[1]["last_error"], got[1]
    assert got[2]["last_error"] is None
    cli_json(home, "stop", "--job", "p1")
    wait_state(home, "p1", ("terminated",))


def test_until_ready_stops_calling_a_probe_once_it_passed(home, agent):
    web = free_port()
    spec = job_spec("p2", [f"exec python3 -m http.server {web} --bind 127.0.0.1"],
                    probes=[probe(port=web, ready_after=2, until_ready=True)])
    submit(home, "p2", spec)
    wait_state(home, "p2", ("running",))
    passed = wait_for(lambda: (p := probes_of(home, "p2")) and p[0]["success_streak"] >= 2 and p, 20, "two passes")
    calls = passed[0]["calls"]
    time.sleep(2.5)  # a would-be third call's interval, twice over
    later = probes_of(home, "p2")[0]
    assert later["calls"] == calls and later["success_streak"] == 2, "no call after ready_after passes"
    cli_json(home, "stop", "--job", "p2")


def test_a_node_with_a_loopback_address_of_its_own_is_probed_there_not_at_127_0_0_1(home, agent):
    """The local backend's nodes are 127.0.0.2, 127.0.0.3, ...: each node's server listens at its own
    address (two on one port), and its probe must reach that one, not whatever 127.0.0.1 has."""
    port = free_port()
    spec = job_spec("p4", [f"exec python3 -m http.server {port} --bind 127.0.0.7"], node_ip="127.0.0.7",
                    probes=[probe(port=port), probe(type="tcp", port=port)])
    submit(home, "p4", spec)
    wait_state(home, "p4", ("running",))
    got = wait_for(lambda: (p := probes_of(home, "p4")) and all(r["success_streak"] for r in p) and p, 20,
                   "both probes passing at the node's own address")
    assert [r["last_error"] for r in got] == [None, None]
    cli_json(home, "stop", "--job", "p4")
    wait_state(home, "p4", ("terminated",))


def test_a_spec_with_a_malformed_probe_is_refused_at_submit(home):
    bad = job_spec("p3", ["true"], probes=[{"type": "exec", "command": "rm -rf /", "interval": 1, "timeout": 1}])
    result = cli(home, "submit", "--job", "p3", stdin=json.dumps(bad).encode())
    assert result.returncode == 1
    assert "spec.probes[0].command" in json.loads(result.stdout)["error"]


@pytest.mark.parametrize("probes", [
    "all good", [{"success_streak": -1}], [{"success_streak": True}], [{"last_error": "x"}],
    [{"success_streak": 1, "last_error": 7}], [{"success_streak": 1, "last_at": "now"}],
    [{"success_streak": 1}] * 65,
])
def test_a_hostile_hosts_probe_results_are_refused_before_the_engine_reads_them(probes):
    from runner.protocol import status_problem

    doc = {"agent_alive": True, "jobs": {"j": {"state": "running", "probes": probes}}}
    assert "probe" in status_problem(doc)
    assert status_problem({"agent_alive": True, "jobs": {"j": {"state": "running", "probes": [
        {"success_streak": 2, "last_error": None, "last_at": 1.5, "calls": 3}]}}}) is None
