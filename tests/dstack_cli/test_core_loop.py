"""The unchanged dstack CLI against a live Muster (a real Celery worker) and real sshd hosts in
network namespaces: project add, an SSH fleet applied until active, a task applied detached, ps,
logs, stop with nothing left on the host, a missing run's error, the fleet deleted with no agent left."""

from __future__ import annotations

import pytest
import yaml

from instances.models import Fleet
from runs.models import Run
from tests.conftest import token_for
from tests.dstack_cli.helpers import dstack_runner
from tests.ssh_e2e.helpers import host_commands, needs_netns, netns_pool, runner_processes, short_ssh_timeouts  # noqa: F401 - an autouse fixture
from tests.waiting import wait_until

pytestmark = [*needs_netns, pytest.mark.dstack_cli, pytest.mark.django_db(transaction=True)]


pool = netns_pool(2)


@pytest.fixture
def dstack(live_server, make_user, celery_worker, tmp_path):
    return dstack_runner(tmp_path, live_server.url, token_for(make_user("alice")))


def _write(path, doc) -> str:
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def _run_status(name: str, wanted: tuple[str, ...]) -> str:
    def reached():
        run = Run.objects.filter(name=name).first()
        return run.status if run is not None and run.status in wanted else None

    return wait_until(reached, timeout=120, what=f"run {name} to be {' or '.join(wanted)}")


def test_the_dstack_cli_runs_the_core_loop_on_an_ssh_fleet(dstack, pool, tmp_path):
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "id_fleet").write_text(pool.private_key)
    (keys / "id_fleet").chmod(0o600)
    fleet_yml = _write(tmp_path / "fleet.yml", {
        "type": "fleet", "name": "pd", "placement": "cluster",
        "ssh_config": {"user": pool.user, "identity_file": str(keys / "id_fleet"),
                       "hosts": [{"hostname": h.address, "port": h.port} for h in pool]}})

    applied = dstack("apply", "-f", fleet_yml, "-y")
    assert applied.returncode == 0, (applied.stdout, applied.stderr)
    assert "pd" in applied.stdout and "idle" in applied.stdout, applied.stdout
    fleet = Fleet.objects.get(name="pd")
    assert fleet.status == "active" and fleet.private_key == pool.private_key

    listed = dstack("fleet")
    assert listed.returncode == 0, listed.stderr
    rows = listed.stdout.splitlines()
    assert any(row.split()[:1] == ["pd"] and "active" in row for row in rows), listed.stdout
    for i in range(2):
        assert any(f"instance={i}" in row and "idle" in row for row in rows), listed.stdout

    task_yml = _write(tmp_path / "task.yml", {
        "type": "task", "name": "hello", "nodes": 2, "env": {"GREETING": "hello"},
        "commands": ["echo $GREETING from rank $DSTACK_NODE_RANK of $DSTACK_NODES_NUM"]})
    submitted = dstack("apply", "-f", task_yml, "-y", "-d")
    assert submitted.returncode == 0, (submitted.stdout, submitted.stderr)
    assert "hello" in submitted.stdout, submitted.stdout
    assert _run_status("hello", ("done", "failed", "terminated")) == "done"

    every = dstack("ps", "-a")
    assert every.returncode == 0, every.stderr
    line = next(row for row in every.stdout.splitlines() if "hello" in row)
    assert "done" in line, every.stdout
    latest = dstack("ps")  # with no active run, dstack shows the last one
    assert latest.returncode == 0 and "hello" in latest.stdout, latest.stdout

    logs = dstack("logs", "hello")
    assert logs.returncode == 0, logs.stderr
    assert "hello from rank 0 of 2" in logs.stdout and "rank 1" not in logs.stdout, logs.stdout
    second = dstack("logs", "hello", "--job", "1")
    assert second.returncode == 0 and "hello from rank 1 of 2" in second.stdout, second.stdout

    typo = _write(tmp_path / "typo.yml", {"type": "task", "name": "typo", "comands": ["echo"]})
    refused = dstack("apply", "-f", typo, "-y", "-d")
    assert refused.returncode != 0 and "comands" in refused.stdout + refused.stderr, (refused.stdout, refused.stderr)
    assert not Run.objects.filter(name="typo").exists()
    # a backend Muster does not have (dstack's own examples name `crusoe`) is accepted, as dstack accepts
    # it: no fleet here is of that kind, so the plan has no offer and the run finds no capacity
    crusoe = _write(tmp_path / "crusoe.yml", {"type": "task", "name": "crusoe", "commands": ["echo"],
                                              "backends": ["crusoe"]})
    accepted = dstack("apply", "-f", crusoe, "-y", "-d")
    assert accepted.returncode == 0, (accepted.stdout, accepted.stderr)
    assert "No matching instance offers available" in accepted.stdout, accepted.stdout
    assert _run_status("crusoe", ("failed",)) == "failed"
    assert "`backends` (crusoe)" in Run.objects.get(name="crusoe").termination_message

    sleeper_yml = _write(tmp_path / "sleeper.yml", {
        "type": "task", "name": "sleeper", "commands": ["echo started", "sleep 333"]})
    assert dstack("apply", "-f", sleeper_yml, "-y", "-d").returncode == 0
    _run_status("sleeper", ("running",))
    running = dstack("ps")
    assert any("sleeper" in row and "running" in row for row in running.stdout.splitlines()), running.stdout
    assert "hello" not in running.stdout, running.stdout  # only active runs
    stopped = dstack("stop", "sleeper", "-y")
    assert stopped.returncode == 0, (stopped.stdout, stopped.stderr)
    assert "Stopped" in stopped.stdout, stopped.stdout
    assert _run_status("sleeper", ("terminated", "failed", "done")) == "terminated"
    for host in pool:
        wait_until(lambda h=host: not any("sleep 333" in c for c in host_commands(h)), timeout=30,
                   what=f"the job's processes to end on {host.address}")

    removed = dstack("delete", "-f", task_yml, "-y")
    assert removed.returncode == 0, (removed.stdout, removed.stderr)
    assert not Run.objects.filter(name="hello").exists()

    missing = dstack("logs", "no-such-run")
    assert missing.returncode != 0
    assert "Run no-such-run not found" in missing.stdout + missing.stderr, (missing.stdout, missing.stderr)

    deleted = dstack("fleet", "delete", "pd", "-y")
    assert deleted.returncode == 0, (deleted.stdout, deleted.stderr)
    wait_until(lambda: not Fleet.objects.filter(name="pd").exists(), timeout=60, what="fleet pd to be deleted")
    for host in pool:
        wait_until(lambda h=host: not runner_processes(h), timeout=60, what=f"no agent left on {host.address}")
    gone = dstack("fleet")
    assert gone.returncode == 0 and "pd" not in gone.stdout.split(), gone.stdout

    # the other way to delete: by the file, which polls fleets/get until "not found"
    assert dstack("apply", "-f", fleet_yml, "-y").returncode == 0
    by_file = dstack("delete", "-f", fleet_yml, "-y")
    assert by_file.returncode == 0, (by_file.stdout, by_file.stderr)
    assert not Fleet.objects.filter(name="pd").exists()
    for host in pool:
        wait_until(lambda h=host: not runner_processes(h), timeout=60, what=f"no agent left on {host.address}")


def test_dstack_fleet_delete_instances_removes_only_those_hosts(dstack, pool, tmp_path):
    key = tmp_path / "id_fleet"
    key.write_text(pool.private_key)
    key.chmod(0o600)
    fleet_yml = _write(tmp_path / "fleet.yml", {
        "type": "fleet", "name": "two", "placement": "cluster",
        "ssh_config": {"user": pool.user, "identity_file": str(key),
                       "hosts": [{"hostname": h.address, "port": h.port} for h in pool]}})
    assert dstack("apply", "-f", fleet_yml, "-y").returncode == 0
    first, second = list(pool)
    wait_until(lambda: runner_processes(second), timeout=60, what="the agent on the second host")

    unknown = dstack("fleet", "delete", "two", "-i", "7", "-y")
    assert unknown.returncode != 0 and "has no instances [7]" in unknown.stdout + unknown.stderr, unknown.stdout
    deleted = dstack("fleet", "delete", "two", "-i", "1", "-y")
    assert deleted.returncode == 0, (deleted.stdout, deleted.stderr)
    assert "Fleet two instances deleted" in deleted.stdout, deleted.stdout
    wait_until(lambda: not runner_processes(second), timeout=60, what=f"no agent left on {second.address}")
    assert runner_processes(first), "the other host keeps its agent"
    rows = dstack("fleet").stdout.splitlines()
    assert any("instance=0" in row and "idle" in row for row in rows), rows
    assert not any("instance=1" in row for row in rows), rows

    assert dstack("fleet", "delete", "two", "-y").returncode == 0
    wait_until(lambda: not runner_processes(first), timeout=60, what=f"no agent left on {first.address}")
