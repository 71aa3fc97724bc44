"""Readiness-gated start on real sshd hosts: `probes` run by each host's runner, `startup_order`
waiting for *ready*, `ready_timeout`, through the `muster` CLI and the REST API with a real worker.

Three hosts, each in its own network namespace (its own 127.0.0.1, which the probes call). The
jobs write their own timestamps (one clock: the namespaces share the machine's), so the order is
read from what the nodes saw, not from what the server recorded.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from events.models import Event
from instances.models import Instance
from instances.services.fleets import apply_fleet
from runs.models import Run
from runs.services import logs
from tests.conftest import client_for, token_for
from tests.engine.helpers import wait_for_run
from tests.ssh_e2e.helpers import Beat, fleet_configuration, host_commands, needs_netns, runner_processes
from tests.waiting import job_states, patient, wait_until

pytestmark = [*needs_netns, pytest.mark.django_db(transaction=True), pytest.mark.slow]

MUSTER = [sys.executable, "-c", "import sys; from cli.main import main; sys.exit(main())"]
NOW = "$(python3 -c 'import time; print(time.time())')"

# The workers serve only SERVE_DELAY seconds after they start; the router asks both once, at once,
# then says goodbye to each (a worker ends `done` on `/bye`), so the run ends `all-done`.
SERVE_DELAY = 4
FETCH = "python3 -c \"import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=3)\""
ORDERED = f"""
type: task
name: ready-order
fleets: [pd]
startup_order: workers-first
groups:
  - name: router
    nodes: 1
    commands:
      - echo "ROUTER_START {NOW}"
      - |
        ips="${{{{ groups[1].nodes[0].IP_ADDRESS }}}} ${{{{ groups[1].nodes[1].IP_ADDRESS }}}}"
        for ip in $ips; do
          if {FETCH} http://$ip:8000/ 2>/dev/null; then echo "ROUTER_GOT $ip ok"; else echo "ROUTER_GOT $ip refused"; fi
        done
        for ip in $ips; do
          for i in $(seq 120); do {FETCH} http://$ip:8000/bye 2>/dev/null && break; sleep 1; done
        done
  - name: workers
    nodes: 2
    ports: [8000]
__PROBES__
    commands:
      - sleep {SERVE_DELAY}
      - echo "SERVING_AT {NOW}"
      - |
        python3 - <<'PY'
        import http.server, threading
        class Answer(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"ok")
                if self.path == "/bye":
                    threading.Thread(target=self.server.shutdown).start()
            def log_message(self, *args):
                pass
        server = http.server.ThreadingHTTPServer(("0.0.0.0", 8000), Answer)
        stop = threading.Timer(300, server.shutdown)
        stop.daemon = True
        stop.start()
        server.serve_forever()
        PY
"""
HTTP_PROBES = "    probes: [{type: http, url: /, interval: 1s, timeout: 1s}]"

NEVER_READY = """
type: task
name: never-ready
fleets: [pd]
startup_order: workers-first
groups:
  - name: router
    nodes: 1
    commands: [echo "ROUTER_RAN"]
  - name: workers
    nodes: 2
    probes: [{type: tcp, port: 8009, interval: 1s, timeout: 1s}]
    ready_timeout: 5s
    commands: [sleep 313]
"""


@pytest.fixture
def fleet(ssh_hosts, fast_limits):
    from projects.models import Project

    project, _ = Project.objects.get_or_create(name="main")
    pool = ssh_hosts(3, mode="netns")
    apply_fleet(project, {"configuration": fleet_configuration(pool)}, actor="test")
    return pool


@pytest.fixture
def muster(live_server, make_user, celery_worker, tmp_path):
    user = make_user("alice")
    token = token_for(user)
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home), "MUSTER_URL": live_server.url, "MUSTER_TOKEN": token,
           "MUSTER_PROJECT": "main"}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*MUSTER, *args], env=env, capture_output=True, text=True, timeout=patient(150),
                              cwd=Path(__file__).resolve().parents[2], stdin=subprocess.DEVNULL)

    run.api = client_for(user)
    with Beat():
        yield run


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "task.yml"
    path.write_text(text)
    return str(path)


def stamps(text: str, word: str) -> list[float]:
    return [float(line.split()[-1]) for line in text.splitlines() if line.startswith(word + " ")]


def story(run) -> str:
    """What happened to the run, for a failure's message: its jobs, their probes, and its events in order."""
    jobs = "\n".join(f"job {j.job_num}: {j.status} {j.termination_reason} {j.termination_message!r} "
                     f"ready_at={j.ready_at} probes={j.probes}" for j in run.current_jobs())
    events = "\n".join(f"{e.created:%H:%M:%S.%f} {e.subject}: {e.message}"
                       for e in Event.objects.filter(run=run).order_by("created", "pk"))
    return f"{jobs}\n{events}"


def test_workers_first_with_http_probes_starts_the_router_after_both_workers_answer(muster, fleet, tmp_path):
    done = muster("apply", "-f", write(tmp_path, ORDERED.replace("__PROBES__", HTTP_PROBES)), "-y")
    run = Run.objects.get(name="ready-order")
    assert done.returncode == 0, f"{done.stdout[-1500:]}\n{done.stderr[-1500:]}\n{story(run)}"
    router, *workers = run.current_jobs()
    router_start = stamps(logs.read(router).decode(), "ROUTER_START")[0]
    serving = [stamps(logs.read(w).decode(), "SERVING_AT")[0] for w in workers]
    assert router_start > max(serving), "the router started only once both workers served"
    assert logs.read(router).decode().count(" ok\n") == 2, logs.read(router).decode()

    # the API: ready_at set once the probe passed, after the worker served; each probe's last result
    answer = muster.api.get("/api/projects/main/runs/ready-order/").json()
    jobs = {j["job_num"]: j for j in answer["jobs"]}
    for num in (1, 2):
        assert jobs[num]["ready_at"] is not None
        assert jobs[num]["probes"][0]["probe"] == "http GET :8000/"
        last = jobs[num]["probes"][0]
        # the last result: passing, or failing because the worker shut its server on /bye and a look
        # saw that before the job's end (the events below say each passed first)
        assert (last["success_streak"] >= 1 and last["last_error"] is None) or (
            last["success_streak"] == 0 and last["last_error"]), last
    assert jobs[0]["ready_at"] is not None, "a group without probes is ready once it runs"
    assert jobs[0]["waiting_for"] == "", "a started job waits for nothing"

    # the CLI: ps -v shows ready, and the events say when each worker became ready and what the
    # router waited for
    table = muster("ps", "-v", "-a").stdout
    header, *rows = table.splitlines()
    assert "READY" in header.upper()
    assert all(" yes " in row for row in rows if row.split()[0] == "ready-order"), table
    events = muster("events", "ready-order", "--limit", "200").stdout
    assert events.count("ready: http GET :8000/ passed") == 2, events
    assert "waiting for the workers to be ready" in events, events
    assert not Instance.objects.filter(status="busy").exists()


def test_without_probes_workers_first_waits_for_running_as_before(muster, fleet, tmp_path):
    # the workers serve long after they run, so the router, started once they run, finds them closed
    late = ORDERED.replace("__PROBES__\n", "").replace(f"sleep {SERVE_DELAY}\n", "sleep 25\n")
    done = muster("apply", "-f", write(tmp_path, late), "-y")
    run = Run.objects.get(name="ready-order")
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:], job_states(run))
    router, *workers = run.current_jobs()
    router_start = stamps(logs.read(router).decode(), "ROUTER_START")[0]
    serving = [stamps(logs.read(w).decode(), "SERVING_AT")[0] for w in workers]
    # dstack's order: the router starts once the workers run, not once they serve
    assert router.start_time > max(w.start_time for w in workers)
    assert router_start < max(serving), (router_start, serving)
    assert " refused\n" in logs.read(router).decode()


def test_a_probe_that_never_passes_fails_the_run_after_ready_timeout_with_nothing_left_running(
        muster, fleet, tmp_path):
    done = muster("apply", "-f", write(tmp_path, NEVER_READY), "-y")
    assert done.returncode != 0
    run = wait_for_run("never-ready", timeout=90)
    assert run.status == "failed", job_states(run)
    router, *workers = run.current_jobs()
    reasons = {w.termination_reason for w in workers}
    assert "waiting_ready_limit_exceeded" in reasons, job_states(run)
    failed = next(w for w in workers if w.termination_reason == "waiting_ready_limit_exceeded")
    assert "not ready within ready_timeout 5s: tcp :8009" in failed.termination_message
    ended = Event.objects.get(job=failed, message__startswith="not ready within").created.timestamp()
    assert ended - failed.start_time >= 5, "not before ready_timeout"
    assert router.start_time is None, "the router never started: its workers never became ready"
    assert "ROUTER_RAN" not in logs.read(router).decode()
    assert "waiting_ready_limit_exceeded" in muster("ps", "-v", "-a").stdout
    for host in fleet:
        wait_until(lambda h=host: not any("sleep 313" in c for c in host_commands(h)), 30,
                   f"no job process left on {host}")
        assert [c for c in runner_processes(host) if " job " in f" {c} "] == []
    assert not Instance.objects.filter(status="busy").exists()
