"""The access matrix's runner half, end to end: real Celery worker, real runner agents and jobs.

Two projects with the same fleet name, run name and secret name on the local backend: each sees
only its own output, stopping or deleting in one never touches the other, and no file of a job
can be read by another OS user. And no process of a job outlives it, however it ended.
"""

from __future__ import annotations

import stat
import uuid
from pathlib import Path

import pytest

from runs.models import Job
from runs.services import logs
from tests.conftest import client_for
from tests.engine.helpers import wait_for_run
from tests.runner.runner_helpers import (
    escape_commands,
    escaped_processes,
    free_port,
    kill_escapes,
    nothing_of_the_job_left,
)
from tests.ssh_e2e.helpers import fleet_configuration, needs_netns
from tests.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture(autouse=True)
def _no_leftover_processes(settings):
    yield
    from tests.local_processes import kill_everything_under

    kill_everything_under(Path(settings.MUSTER["LOCAL_DIR"]))


@pytest.fixture
def root(django_user_model):
    """Local fleets run jobs as the server's own OS user: only a superuser may create them."""
    return client_for(django_user_model.objects.create_superuser(username="root", password="x"))


@pytest.fixture
def members(make_user):
    return {project: client_for(make_user(f"admin-{project}", project)) for project in ("p1", "p2")}


def url(project: str, path: str) -> str:
    return f"/api/projects/{project}/{path}"


def local_fleet(root, project: str, name: str = "lf", nodes: int = 1) -> None:
    conf = f"type: fleet\nname: {name}\nbackends: [local]\nplacement: cluster\nnodes: {nodes}\n"
    resp = root.post(url(project, "fleets/"), {"configuration": conf}, format="json")
    assert resp.status_code == 201, resp.content


def submit(client, project: str, conf: str) -> None:
    resp = client.post(url(project, "runs/"), {"configuration": conf}, format="json")
    assert resp.status_code == 201, resp.content


def log_text(client, project: str, run: str, job: int = 0) -> str:
    resp = client.get(url(project, f"runs/{run}/logs?job={job}"))
    assert resp.status_code == 200, resp.content
    return resp.json()["text"]


def wait_log(client, project: str, run: str, text: str) -> str:
    def printed() -> str | None:
        whole = log_text(client, project, run)
        return whole if text in whole else None

    return wait_until(printed, 60, f"{project}/{run} to print {text!r}")


def run_status(client, project: str, run: str) -> str:
    return client.get(url(project, f"runs/{run}/")).json()["status"]


CHATTY = """type: task
name: r
env:
  - TOKEN
commands:
  - echo "{project} starts with $TOKEN"
  - sleep 600
"""


def test_two_projects_with_the_same_fleet_run_and_secret_names_stay_apart(fast_limits, celery_worker, root, members):
    for project, client in members.items():
        local_fleet(root, project)
        resp = client.post(url(project, "secrets/"), {"name": "TOKEN", "value": f"secret-of-{project}"}, format="json")
        assert resp.status_code == 201, resp.content
    submit(members["p1"], "p1", CHATTY.format(project="p1"))
    wait_log(members["p1"], "p1", "r", "p1 starts")
    submit(members["p2"], "p2", CHATTY.format(project="p2"))
    wait_log(members["p2"], "p2", "r", "p2 starts")

    assert log_text(members["p1"], "p1", "r") == "p1 starts with secret-of-p1\n"
    assert log_text(members["p2"], "p2", "r") == "p2 starts with secret-of-p2\n"
    jobs = {j.run.project.name: j for j in Job.objects.select_related("run__project", "instance")}
    assert jobs["p1"].runner_job_id != jobs["p2"].runner_job_id
    homes = {p: Path(j.instance.backend_data["home"]) for p, j in jobs.items()}
    assert homes["p1"] != homes["p2"]

    # No file of a job, nor the home above it, is open to another OS user.
    for project, home in homes.items():
        assert open_to_others(home) == [], project
        job_dir = home / "jobs" / jobs[project].runner_job_id
        assert f"secret-of-{project}" not in (job_dir / "spec.json").read_text()

    # Stopping p2's run stops p2's job only.
    assert members["p2"].post(url("p2", "runs/r/stop"), {}, format="json").status_code == 200
    assert wait_for_run("r", ("terminated",), project="p2", timeout=60).status == "terminated"
    assert run_status(members["p1"], "p1", "r") == "running"
    p1_job = homes["p1"] / "jobs" / jobs["p1"].runner_job_id / "status.json"
    assert '"running"' in p1_job.read_text()

    # Deleting p2's fleet leaves p1's fleet, agent and job alone.
    assert members["p2"].delete(url("p2", "fleets/lf/") + "?force=1").status_code == 202
    assert run_status(members["p1"], "p1", "r") == "running"
    assert '"running"' in p1_job.read_text()
    assert log_text(members["p1"], "p1", "r") == "p1 starts with secret-of-p1\n"
    kept = logs.stored_path(jobs["p2"])
    assert kept.read_text() == "p2 starts with secret-of-p2\n"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600 and stat.S_IMODE(kept.parent.stat().st_mode) == 0o700
    assert members["p1"].post(url("p1", "runs/r/stop"), {}, format="json").status_code == 200
    assert wait_for_run("r", ("terminated",), project="p1", timeout=60).status == "terminated"
    assert log_text(members["p1"], "p1", "r") == "p1 starts with secret-of-p1\n"


def test_a_new_run_with_an_old_name_never_shows_the_old_runs_output(fast_limits, celery_worker, root, members):
    client = members["p1"]
    local_fleet(root, "p1")
    submit(client, "p1", "type: task\nname: r\ncommands:\n  - echo output of the first run\n")
    assert wait_for_run("r", project="p1", timeout=60).status == "done"
    assert log_text(client, "p1", "r") == "output of the first run\n"

    # The same name again, for a run that can never start here (no host has 8 GPUs).
    submit(client, "p1", "type: task\nname: r\nresources:\n  gpu: 8\ncommands:\n  - echo second\n")

    assert log_text(client, "p1", "r") == ""
    assert wait_for_run("r", ("failed", "terminated"), project="p1", timeout=60)
    assert log_text(client, "p1", "r") == ""


@pytest.fixture
def escapes():
    token = f"esc-{uuid.uuid4().hex[:12]}"
    ports = (free_port(), free_port())
    yield token, ports
    kill_escapes(token, ports)
    Path(f"/tmp/{token}.up").unlink(missing_ok=True)


def escaping_run(token: str, ports: tuple[int, int], ending: str) -> str:
    """A run whose (last) node leaves `timeout`, `setsid` and a daemon behind, then ends as told."""
    up = f"/tmp/{token}.up"
    escape = f"  - {escape_commands(token, ports)[0]}\n"
    if ending == "master-done":
        # node 0 finishes once node 1's escapes are up; master-done then stops node 1
        return (
            "type: task\nname: esc\nnodes: 2\nstop_criteria: master-done\ncommands:\n"
            f'  - if [ "$DSTACK_NODE_RANK" = 0 ]; then while [ ! -e {up} ]; do sleep 0.2; done; exit 0; fi\n'
            f"{escape}  - touch {up}\n  - sleep 600\n"
        )
    return f"type: task\nname: esc\ncommands:\n{escape}" + ("" if ending == "done" else "  - sleep 600\n")


@pytest.mark.parametrize("ending", ["done", "stop", "abort", "master-done", "fleet-delete"])
def test_no_process_of_a_job_outlives_its_end(fast_limits, celery_worker, root, members, escapes, ending):
    token, ports = escapes
    client = members["p1"]
    local_fleet(root, "p1", nodes=2)
    submit(client, "p1", escaping_run(token, ports, ending))
    if ending in ("stop", "abort", "fleet-delete"):
        # the job says so once both escapes listen: a stop sent before that line is printed rightly
        # leaves no such line to check below
        wait_until(lambda: len(escaped_processes(token, ports)) >= 3
                   and "escapes up" in log_text(client, "p1", "esc", job=0), 60, "the escapes to be up")
    if ending in ("stop", "abort"):
        body = {"abort": True} if ending == "abort" else {}
        assert client.post(url("p1", "runs/esc/stop"), body, format="json").status_code == 200
    if ending == "fleet-delete":
        assert client.delete(url("p1", "fleets/lf/") + "?force=1").status_code == 202
    final = {"done": "done", "master-done": "done"}.get(ending, "terminated")
    assert wait_for_run("esc", (final,), project="p1", timeout=60).status == final

    assert "escapes up" in log_text(client, "p1", "esc", job=1 if ending == "master-done" else 0)

    wait_until(lambda: nothing_of_the_job_left(token, ports), 30,
               f"no process of the job left: {escaped_processes(token, ports)}")


# ---- the same over SSH: two projects, each with a namespace host of its own, identical names ------

SSH_CHATTY = """type: task
name: r
env:
  - TOKEN
commands:
  - echo "{project} starts with $TOKEN"
  - env | sort > env.txt
  - sleep 600
"""


def with_marks(marks):
    def apply(test):
        for mark in marks:
            test = mark(test)
        return test

    return apply


def open_to_others(root: Path, under: str = "") -> list[tuple[str, str]]:
    """(path, mode) of what under `root` another OS user could read; the root itself included. A
    file gone between listing and looking (the runner's atomic writes rename their temp files) is
    skipped."""
    found = []
    for path in [root, *(root / under).rglob("*")]:
        try:
            mode = path.lstat().st_mode
        except FileNotFoundError:
            continue
        if not stat.S_ISLNK(mode) and stat.S_IMODE(mode) & 0o077:
            found.append((str(path), oct(mode)))
    return found


def job_dir_on(host, job) -> Path:
    """The job's directory under the runner home its instance got at registration (one per instance)."""
    found = wait_until(lambda: list(host.muster_home.glob(f"**/jobs/{job.runner_job_id}")), 30, "the job's directory")
    assert len(found) == 1, found
    return found[0]


@with_marks(needs_netns)
def test_two_projects_on_ssh_hosts_with_the_same_names_stay_apart(fast_limits, celery_worker, members, ssh_hosts):
    hosts = {"p1": ssh_hosts(1, mode="netns")[0], "p2": ssh_hosts(1, mode="netns")[0]}
    for project, client in members.items():
        conf = fleet_configuration(hosts[project].pool, name="lf")
        resp = client.post(url(project, "fleets/"), {"configuration": conf}, format="json")
        assert resp.status_code == 202, resp.content  # registered by the worker
        fleet = wait_until(lambda c=client, p=project: (f := c.get(url(p, "fleets/lf/")).json())["status"] != "pending"
                           and f, timeout=90, what=f"fleet lf of {project} registered")
        assert fleet["status"] == "active", fleet
        resp = client.post(url(project, "secrets/"), {"name": "TOKEN", "value": f"secret-of-{project}"}, format="json")
        assert resp.status_code == 201, resp.content
    for project, client in members.items():
        submit(client, project, SSH_CHATTY.format(project=project))
    for project, client in members.items():
        wait_log(client, project, "r", f"{project} starts")
    jobs = {j.run.project.name: j for j in Job.objects.select_related("run__project", "instance")}

    for project, host in hosts.items():
        assert log_text(members[project], project, "r") == f"{project} starts with secret-of-{project}\n"
        job_dir = job_dir_on(host, jobs[project])
        runner_home = job_dir.parent.parent
        env_file = job_dir / "workdir" / "env.txt"
        wait_until(lambda f=env_file: f.exists() and f.read_text().endswith("\n"), 30, "env.txt")
        job_env = dict(line.split("=", 1) for line in env_file.read_text().splitlines() if "=" in line)
        # The sshd session's variables are not the job's: it starts from the runner's minimal set.
        assert not {"SSH_CONNECTION", "SSH_CLIENT", "SSH_AUTH_SOCK"} & set(job_env), sorted(job_env)
        assert job_env["TOKEN"] == f"secret-of-{project}"
        assert f"secret-of-{project}" not in (job_dir / "spec.json").read_text()
        # The home is closed to others; the runner's own code under bin/ is installed by the server.
        assert open_to_others(runner_home, under="jobs") == [], project

    assert members["p2"].post(url("p2", "runs/r/stop"), {}, format="json").status_code == 200
    assert wait_for_run("r", ("terminated",), project="p2", timeout=60).status == "terminated"
    assert members["p2"].delete(url("p2", "fleets/lf/") + "?force=1").status_code == 202
    assert run_status(members["p1"], "p1", "r") == "running"
    p1_status = job_dir_on(hosts["p1"], jobs["p1"]) / "status.json"
    assert '"running"' in p1_status.read_text()
    assert log_text(members["p1"], "p1", "r") == "p1 starts with secret-of-p1\n"
    assert members["p1"].post(url("p1", "runs/r/stop"), {}, format="json").status_code == 200
    assert wait_for_run("r", ("terminated",), project="p1", timeout=60).status == "terminated"


@with_marks(needs_netns)
def test_two_projects_sharing_a_fleet_with_the_same_names_stay_apart(fast_limits, celery_worker, members, ssh_hosts):
    """The same run and secret names in two projects on one fleet of p1 shared with p2 (docs/queueing.md):
    each sees its own output and secret only, the owner's view of its hosts never names p2's run,
    and p2 can neither delete p1's fleet nor stop p1's run by stopping its own."""
    pool = ssh_hosts(2, mode="netns")
    conf = {**fleet_configuration(pool, name="lf"), "shared_with": [{"project": "p2", "quota": {"hosts": 1}}]}
    resp = members["p1"].post(url("p1", "fleets/"), {"configuration": conf}, format="json")
    assert resp.status_code == 202, resp.content
    fleet = wait_until(lambda: (f := members["p1"].get(url("p1", "fleets/lf/")).json())["status"] != "pending" and f,
                       timeout=90, what="fleet lf registered")
    assert fleet["status"] == "active", fleet
    for project, client in members.items():
        resp = client.post(url(project, "secrets/"), {"name": "TOKEN", "value": f"secret-of-{project}"}, format="json")
        assert resp.status_code == 201, resp.content
    submit(members["p1"], "p1", SSH_CHATTY.format(project="p1"))
    submit(members["p2"], "p2", SSH_CHATTY.format(project="p2").replace("name: r\n", "name: r\nfleets: [p1/lf]\n"))
    for project, client in members.items():
        wait_log(client, project, "r", f"{project} starts")
    for project, client in members.items():
        assert log_text(client, project, "r") == f"{project} starts with secret-of-{project}\n"
    jobs = {j.run.project.name: j for j in Job.objects.select_related("run__project", "instance")}
    assert jobs["p1"].instance.fleet_id == jobs["p2"].instance.fleet_id and jobs["p1"].instance_id != jobs["p2"].instance_id
    hosts = {i["name"]: i["job"] for i in members["p1"].get(url("p1", "instances/")).json()}
    assert sorted(hosts.values()) == ["another project's job", "r/0"], hosts
    assert members["p2"].delete(url("p2", "fleets/lf/") + "?force=1").status_code == 404

    assert members["p2"].post(url("p2", "runs/r/stop"), {}, format="json").status_code == 200
    assert wait_for_run("r", ("terminated",), project="p2", timeout=60).status == "terminated"
    assert run_status(members["p1"], "p1", "r") == "running"
    events = str(members["p1"].get(url("p1", "events/")).json())
    assert "given back by another project's job" in events and "secret-of-p2" not in events
    assert log_text(members["p1"], "p1", "r") == "p1 starts with secret-of-p1\n"
    assert members["p1"].post(url("p1", "runs/r/stop"), {}, format="json").status_code == 200
    assert wait_for_run("r", ("terminated",), project="p1", timeout=60).status == "terminated"



def test_a_job_whose_log_cannot_be_kept_still_has_its_files_removed_from_the_host(
        fast_limits, celery_worker, root, members, settings):
    client = members["p1"]
    local_fleet(root, "p1")
    blocker = Path(settings.MUSTER["LOG_DIR"])
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_text("a file where the log directory should be\n")  # the server cannot write logs
    assert client.post(url("p1", "secrets/"), {"name": "TOKEN", "value": "s3cr3t"}, format="json").status_code == 201
    submit(client, "p1", 'type: task\nname: r\nenv:\n  - TOKEN\ncommands:\n  - echo "token $TOKEN"\n')

    assert wait_for_run("r", project="p1", timeout=60).status == "done"

    job = Job.objects.select_related("instance").get(run__project__name="p1", run__name="r")
    job_dir = Path(job.instance.backend_data["home"]) / "jobs" / job.runner_job_id
    assert not job_dir.exists(), sorted(p.name for p in job_dir.iterdir())
