"""The `muster` CLI as a user runs it: its own process, against a live server, a real Celery worker
and the local backend's runner agents."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from instances.services.fleets import create_local_fleet
from runs.models import Run
from tests.conftest import token_for
from tests.engine.helpers import wait_for_run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

MUSTER = [sys.executable, "-c", "import sys; from cli.main import main; sys.exit(main())"]

# A worker that fails on stderr after some output: its last lines must reach the user. The workers
# start once the router runs (depends_on): one failed node ends the run, and a router not started
# by then would rightly print nothing. For the same reason the failing worker waits (up to 20 s)
# for its sibling to have written its first line: on a loaded machine it could otherwise fail, and
# end the run, before the other worker had started at all (seen in CI).
FAILING = """\
type: task
name: failing
groups:
  - name: router
    nodes: 1
    commands: [echo router up, sleep 30]
  - name: workers
    nodes: 2
    depends_on: [router]
    commands:
      - echo "worker $DSTACK_NODE_RANK starting"
      - |
        if [ "$DSTACK_NODE_RANK" = 2 ]; then
          for _ in $(seq 200); do [ -e {started} ] && break; sleep 0.1; done
          echo "CUDA out of memory on rank $DSTACK_NODE_RANK" >&2
          exit 3
        fi
        touch {started}
        sleep 30
"""

TWO_GROUPS = """\
type: task
name: two
groups:
  - name: router
    nodes: 1
    commands: [echo "router line 1", echo "router line 2"]
  - name: workers
    nodes: 2
    commands: [echo "worker $DSTACK_NODE_RANK says hi"]
"""


@pytest.fixture
def local_fleet(fast_limits):
    from projects.models import Project

    project, _ = Project.objects.get_or_create(name="main")
    fleet = create_local_fleet(project, "local", 4, placement="cluster")
    yield fleet
    from engine.groups import terminate_fleet_instances

    terminate_fleet_instances(fleet)


@pytest.fixture
def muster(live_server, make_user, tmp_path):
    token = token_for(make_user("alice"))
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home), "MUSTER_URL": live_server.url, "MUSTER_TOKEN": token,
           "MUSTER_PROJECT": "main"}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*MUSTER, *args], env=env, capture_output=True, text=True, timeout=180,
                              cwd=Path(__file__).resolve().parents[2], stdin=subprocess.DEVNULL)

    run.env = env
    return run


def failing(tmp_path: Path) -> str:
    return FAILING.replace("{started}", str(tmp_path / "worker-1-started"))


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "task.yml"
    path.write_text(text)
    return str(path)


def test_apply_follows_every_job_and_ends_with_the_failed_workers_last_lines(
        muster, local_fleet, celery_worker, tmp_path):
    result = muster("apply", "-f", write(tmp_path, failing(tmp_path)), "-y")

    assert result.returncode == 1, result.stderr
    out, err = result.stdout, result.stderr
    # every job's log, not only job 0's, each line under its group and rank in the group
    # (DSTACK_NODE_RANK counts across groups)
    assert "[router/0] router up\n" in out
    assert "[workers/0] worker 1 starting\n" in out
    assert "[workers/1] worker 2 starting\n" in out
    assert "[workers/1] CUDA out of memory on rank 2\n" in out
    # the summary: one row per job, then the failed job's last lines
    summary = err[err.index("JOB  GROUP"):]
    rows = [line.split() for line in summary.splitlines()[1:4]]
    assert [(r[0], r[1], r[2]) for r in rows] == [("0", "router", "0"), ("1", "workers", "0"), ("2", "workers", "1")]
    assert rows[2][3] == "failed"
    assert "last lines of job 2 (workers/1):" in summary
    assert "  | CUDA out of memory on rank 2" in summary
    assert "run failing: failed" in summary


def test_logs_ps_events_and_delete_of_a_run(muster, local_fleet, celery_worker, tmp_path):
    submitted = muster("apply", "-f", write(tmp_path, TWO_GROUPS), "-y", "-d")
    assert submitted.returncode == 0, submitted.stderr

    # follows until every job has finished, whatever it had written when logs started
    logs = muster("logs", "two")
    assert logs.returncode == 0, logs.stderr
    lines = logs.stdout.splitlines()
    assert sorted(lines) == sorted(["[router/0] router line 1", "[router/0] router line 2",
                                    "[workers/0] worker 1 says hi", "[workers/1] worker 2 says hi"])
    assert lines.index("[router/0] router line 1") < lines.index("[router/0] router line 2")
    assert wait_for_run("two").status == "done"

    workers = muster("logs", "two", "--group", "workers")
    assert sorted(workers.stdout.splitlines()) == ["[workers/0] worker 1 says hi", "[workers/1] worker 2 says hi"]
    master = muster("logs", "two", "--job", "0")
    assert master.stdout == "router line 1\nrouter line 2\n"  # one job: its log as written
    missing = muster("logs", "two", "--group", "decode")
    assert missing.returncode == 1 and "no group 'decode' (groups: router, workers)" in missing.stderr

    ps = muster("ps", "-v")
    assert ps.returncode == 0, ps.stderr
    header, *rows = ps.stdout.splitlines()
    assert header.split() == ["RUN", "JOB", "GROUP", "RANK", "HOST", "IP", "STATUS", "RESTARTS", "READY", "REASON"]
    jobs = {j.job_num: j for j in Run.objects.get(name="two").current_jobs().select_related("instance")}
    assert [r.split() for r in rows] == [
        ["two", str(n), jobs[n].node_group_name, str(jobs[n].node_group_rank), jobs[n].instance.name,
         jobs[n].instance.internal_ip, "done", "0", "yes", "done_by_runner"] for n in (0, 1, 2)]

    events = muster("events", "two")
    assert events.returncode == 0, events.stderr
    assert events.stdout.splitlines()[0].split() == ["TIME", "SUBJECT", "STATUS", "ACTOR", "MESSAGE"]
    rows = events.stdout.splitlines()[1:]
    assert "run two" in rows[0] and rows[0].endswith("alice   submitted with 3 jobs"), events.stdout
    assert "run two" in rows[-1] and rows[-1].endswith("done (all_jobs_done)"), events.stdout
    assert sum("job two/2" in row for row in rows) >= 3  # the jobs' events too, not only the run's
    unknown = muster("events", "nope")
    assert unknown.returncode == 1

    refused = muster("delete", "two")  # no terminal to confirm on
    assert refused.returncode == 1 and "-y" in refused.stderr
    assert Run.objects.filter(name="two").exists()
    deleted = muster("delete", "two", "-y")
    assert deleted.returncode == 0, deleted.stderr
    assert not Run.objects.filter(name="two").exists()
    assert "two" not in muster("ps", "-a").stdout


def test_deleting_an_active_run_is_refused_with_the_reason(muster, local_fleet, celery_worker, tmp_path):
    assert muster("apply", "-f", write(tmp_path, failing(tmp_path).replace("exit 3", "sleep 30")), "-y", "-d").returncode == 0
    result = muster("delete", "failing", "-y")
    assert result.returncode == 1
    assert "stop it before deleting it" in result.stderr
    assert Run.objects.filter(name="failing").exists()
    assert muster("stop", "failing", "-y", "--abort").returncode == 0
    wait_for_run("failing")


def test_plan_shows_the_jobs_and_the_hosts_that_fit_each_group(muster, local_fleet, tmp_path):
    result = muster("plan", "-f", write(tmp_path, TWO_GROUPS))

    assert result.returncode == 0, result.stderr
    hosts = sorted(i.name for i in local_fleet.instances.all())
    assert "Fits fleet local now." in result.stdout
    lines = result.stdout.splitlines()
    for group in ("router", "workers"):
        shown = next(line for line in lines if line.startswith(f"  {group}: "))
        assert sorted(shown.split(": ", 1)[1].split(", ")) == hosts
    assert not Run.objects.exists()  # a plan submits nothing


def test_version_is_the_installed_packages():
    from importlib.metadata import version

    result = subprocess.run([*MUSTER, "--version"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    assert result.stdout.strip() == f"muster {version('muster')}"


def test_attach_to_a_local_job_prints_its_addresses_and_follows_the_logs(muster, local_fleet, celery_worker, tmp_path):
    import re

    from tests.waiting import wait_until

    served = ("type: task\nname: served\nports: [8000]\ncommands:\n  - echo local hi > hi.txt\n"
              "  - python3 -m http.server 8000 --bind $DSTACK_NODE_IP\n")
    assert muster("apply", "-f", write(tmp_path, served), "-y", "-d").returncode == 0
    attached = subprocess.Popen([*MUSTER, "attach", "served"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, stdin=subprocess.DEVNULL, env=muster.env,
                                cwd=Path(__file__).resolve().parents[2])
    try:
        err = ""
        while "listens on" not in err:
            line = attached.stderr.readline()
            assert line, f"attach ended: {err}"
            err += line
        url = re.search(r"listens on (http://[\d.]+:8000)", err).group(1)
        ip = Run.objects.get(name="served").current_jobs().get().instance.internal_ip
        assert url == f"http://{ip}:8000"
        assert "forwarding" not in err  # the port is already on this machine

        def fetched():
            try:
                with urllib.request.urlopen(f"{url}/hi.txt", timeout=5) as r:
                    return r.read().decode()
            except OSError:
                return None
        assert wait_until(fetched, timeout=60, what="the job's server") == "local hi\n"
        assert muster("stop", "served", "-y").returncode == 0
        out, rest = attached.communicate(timeout=120)
        assert attached.returncode == 0, err + rest
        assert "[default/0] " in out and "GET /hi.txt" in out
    finally:
        if attached.poll() is None:
            attached.kill()
            attached.wait(10)
