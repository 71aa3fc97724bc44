"""The engine on real sshd hosts (network namespaces, fake nvidia-smi): what a job gets told about
its host, and hosts that come back after being unreachable."""

from __future__ import annotations

import time

import pytest

from instances.models import Instance
from runs.models import Job
from runs.services import logs
from runs.services.submission import submit_run
from tests.conftest import token_for
from tests.engine.helpers import wait_for_run
from tests.ssh_e2e.helpers import (
    L40S,
    Beat,
    fleet_configuration,
    host_commands,
    needs_netns,
    registered_fleet,
)
from tests.waiting import job_states, patient, wait_until

pytestmark = [*needs_netns, pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def project(fast_limits, settings):
    from projects.models import Project

    # hosts are looked at every second, so one that answers again is noticed within the test
    settings.MUSTER = {**settings.MUSTER, "SSH_HEALTH_INTERVAL": 1, "SSH_HEALTH_TIMEOUT": 3}
    project, _ = Project.objects.get_or_create(name="main")
    return project


@pytest.fixture
def beat(celery_worker):
    with Beat() as beat:
        yield beat


def submit(project, text: str):
    return submit_run(project, None, {"configuration": text})


def env_of(log: str) -> dict[str, str]:
    return dict(line[4:].split("=", 1) for line in log.splitlines() if line.startswith("ENV ") and "=" in line)


TWO_L40S_NODES = """
type: task
name: gpus
fleets: [gpu]
nodes: 2
resources: {gpu: L40S}
commands:
  - env | grep -E '^DSTACK_GPUS' | sed 's/^/ENV /'
  - sed 's/^/HOSTFILE /' "$DSTACK_MPI_HOSTFILE"
"""


def test_a_multi_node_job_counts_every_gpu_of_the_host_it_got(ssh_hosts, project, beat):
    pool = ssh_hosts(2, gpus=[L40S, L40S], mode="netns")
    registered_fleet(project, {"configuration": fleet_configuration(pool, name="gpu")}, actor="test")
    run = wait_for_run(submit(project, TWO_L40S_NODES).name, timeout=60)
    assert run.status == "done", job_states(run)
    jobs = list(run.current_jobs().select_related("instance"))
    for job in jobs:
        log = logs.read(job).decode()
        env = env_of(log)
        # `gpu: L40S` asks for at least one; the node has the host's two, as dstack tells it
        assert (env["DSTACK_GPUS_PER_NODE"], env["DSTACK_GPUS_NUM"]) == ("2", "4"), log
        hostfile = [line[9:] for line in log.splitlines() if line.startswith("HOSTFILE ")]
        assert hostfile == [f"{j.instance.internal_ip} slots=2" for j in jobs], log


SLEEPER = """
type: task
name: lonely
fleets: [solo]
commands:
  - echo "first run up"
  - sleep 307
"""

QUICK = """
type: task
name: lonely
fleets: [solo]
commands:
  - echo "second run ran"
"""


def test_a_host_back_from_unreachable_is_offered_only_after_the_jobs_ended_on_it_are_gone(
        ssh_hosts, project, beat):
    pool = ssh_hosts(1, mode="netns")
    host = pool[0]
    registered_fleet(project, {"configuration": fleet_configuration(pool, name="solo")}, actor="test")
    run = submit(project, SLEEPER)
    wait_until(lambda: run.current_jobs().filter(status="running").exists(), 60, "the sleeper running")
    wait_until(lambda: any("sleep 307" in c for c in host_commands(host)), 20, "the sleep on the host")

    host.stop_sshd()  # the job's processes go on; the server can no longer reach them
    run = wait_for_run(run.name, timeout=60)
    lost = Job.objects.get(run=run)
    assert (run.status, lost.termination_reason) == ("failed", "instance_unreachable"), job_states(run)
    instance = Instance.objects.get(pk=lost.instance_id)
    assert (instance.status, instance.unreachable) == ("idle", True)
    assert any("sleep 307" in c for c in host_commands(host)), "the orphan still runs while the host is away"

    host.start_sshd()
    deadline = time.monotonic() + patient(60)
    while Instance.objects.get(pk=instance.pk).unreachable:
        assert time.monotonic() < deadline, "the host never became reachable again"
        time.sleep(0.1)
    # offered again from this moment on: nothing of the ended job may be left on the host
    assert not any("sleep 307" in c for c in host_commands(host)), host_commands(host)
    assert Instance.objects.get(pk=instance.pk).status == "idle"

    again = wait_for_run(submit(project, QUICK).name, timeout=60)
    assert again.status == "done", job_states(again)
    job = again.current_jobs().get()
    assert job.instance_id == instance.pk
    assert "second run ran" in logs.read(job).decode()


def test_muster_instances_shows_a_host_the_server_cannot_reach(ssh_hosts, project, beat, live_server, tmp_path,
                                                               monkeypatch, capsys, make_user):
    from cli import main as cli

    pool = ssh_hosts(2, mode="netns")
    registered_fleet(project, {"configuration": fleet_configuration(pool, name="edge")}, actor="test")
    pool[1].stop_sshd()
    wait_until(lambda: Instance.objects.filter(name="edge-1", unreachable=True).exists(), 30,
               "the server to find edge-1 unreachable")

    token = token_for(make_user("viewer"))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("MUSTER_URL", live_server.url)
    monkeypatch.setenv("MUSTER_TOKEN", token)
    monkeypatch.setenv("MUSTER_PROJECT", "main")
    assert cli.main(["instances"]) == 0
    out = capsys.readouterr().out
    rows = {cells[1]: cells for cells in (line.split() for line in out.splitlines()) if cells[1:2] in (["edge-0"], ["edge-1"])}
    assert out.splitlines()[1].split()[1:4] == ["NAME", "STATUS", "HEALTH"], out
    assert rows["edge-1"][2:4] == ["idle", "unreachable"], out
    assert rows["edge-0"][2:4] == ["idle", "ok"], out


# The hosts have 2 CPUs each: decode's `cpu: 4` is what no L40S host has.
PD_TOO_BIG = """
type: task
name: pd-big
fleets: [pd]
groups:
  - name: router
    nodes: 1
    commands: [echo router]
  - name: decode
    nodes: 1
    resources: {gpu: L40S, cpu: 4}
    commands: [echo decode]
"""
DECODE_REASON = "decode: needs 1 host with gpu L40S and cpu >= 4: fleet pd has 3 hosts, 2 with gpu L40S, " \
                "none of those with cpu >= 4"


@pytest.fixture
def pd_fleet(ssh_hosts, project):
    pool = ssh_hosts(3, gpus=[[], [L40S, L40S], [L40S, L40S]], mode="netns")
    return registered_fleet(project, {"configuration": fleet_configuration(pool, name="pd")}, actor="test")


def test_the_plan_says_which_requirement_of_which_group_no_host_meets(pd_fleet, make_user):
    from tests.conftest import client_for

    api = client_for(make_user("alice"))
    plan = api.post("/api/projects/main/runs/plan", {"configuration": PD_TOO_BIG}, format="json")
    assert plan.status_code == 200, plan.content
    assert plan.json()["capacity"] == {"fits": False, "fleet": None, "reasons": [DECODE_REASON]}

    fitting = PD_TOO_BIG.replace("cpu: 4", "cpu: 2")
    plan = api.post("/api/projects/main/runs/plan", {"configuration": fitting}, format="json")
    capacity = plan.json()["capacity"]
    assert {k: capacity[k] for k in ("fits", "fleet", "reasons")} == {"fits": True, "fleet": "pd", "reasons": []}

    two_decoders = fitting.replace("nodes: 1\n    resources", "nodes: 3\n    resources")
    plan = api.post("/api/projects/main/runs/plan", {"configuration": two_decoders}, format="json")
    assert plan.json()["capacity"]["reasons"] == [
        "decode: needs 3 hosts with gpu L40S: fleet pd has 3 hosts, 2 with gpu L40S: lower the nodes of group decode "
        "to 2 or add 1 host like those to fleet pd"]


def test_a_run_that_fits_nowhere_fails_saying_why(pd_fleet, make_user, beat):
    from tests.conftest import client_for

    api = client_for(make_user("alice"))
    assert api.post("/api/projects/main/runs/", {"configuration": PD_TOO_BIG}, format="json").status_code == 201
    wait_for_run("pd-big", timeout=30)
    run = api.get("/api/projects/main/runs/pd-big/").json()
    assert (run["status"], run["jobs"][0]["termination_reason"]) == ("failed", "failed_to_start_due_to_no_capacity")
    assert run["termination_message"] == f"no fleet can hold every group of this run: {DECODE_REASON}"


def test_muster_apply_shows_why_a_run_fits_nowhere_before_asking(pd_fleet, make_user, live_server, tmp_path,
                                                                 monkeypatch, capsys):
    import io

    from cli import main as cli
    from runs.models import Run

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    token = token_for(make_user("alice"))
    for name, value in (("HOME", str(tmp_path)), ("MUSTER_URL", live_server.url), ("MUSTER_TOKEN", token),
                        ("MUSTER_PROJECT", "main")):
        monkeypatch.setenv(name, value)
    monkeypatch.setattr("sys.stdin", Terminal("n\n"))
    (tmp_path / "pd.yml").write_text(PD_TOO_BIG)
    assert cli.main(["apply", "-f", str(tmp_path / "pd.yml")]) == 0
    out = capsys.readouterr().out
    assert f"No fleet can hold this run now:\n  {DECODE_REASON}\n" in out, out
    assert out.index(DECODE_REASON) < out.index("Submit the run?") < out.index("Not submitted.")
    assert not Run.objects.exists()
