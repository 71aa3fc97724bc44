"""`muster serve` as a real process on the embedded default: it supervises web, worker and beat.

A child that dies is restarted with a line that says so, and the others (the web above all) keep
going; SIGTERM stops every child. Each test starts its own server on a free port and data dir.
"""

from __future__ import annotations

import os
import signal
import urllib.request
from pathlib import Path

import pytest

from bench.soak import ServeProcess
from tests.waiting import wait_until

pytestmark = pytest.mark.slow


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def group_members(pgid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                found.append(int(entry.name))
    return found


@pytest.fixture
def served(tmp_path):
    serve = ServeProcess(tmp_path / "data", concurrency=1).start()
    yield serve
    serve.stop()


def run_to_done(serve: ServeProcess) -> None:
    name = serve.submit()
    wait_until(lambda: serve.status(name) == "done", timeout=120, what=f"run {name} done")


def test_a_killed_worker_is_restarted_with_a_log_line_and_the_web_keeps_serving(served):
    run_to_done(served)
    worker = wait_until(lambda: served.pid_of("worker"), timeout=30, what="the worker")
    web = served.pid_of("web")
    os.kill(worker, signal.SIGKILL)

    wait_until(lambda: "worker restarted" in served.log(), timeout=60, what="a line saying the worker restarted")
    assert f"worker (pid {worker}) exited with signal 9" in served.log()
    assert served.proc.poll() is None, "serve did not stop because a child died"
    assert served.pid_of("web") == web, "the web was left alone"
    assert served.answers()
    new = wait_until(lambda: served.pid_of("worker"), timeout=30, what="the new worker")
    assert new != worker
    wait_until(lambda: not group_members(worker), timeout=20, what="the dead worker's prefork children gone with it")
    run_to_done(served)  # a run submitted after the restart still completes

    # a worker that dies again soon after its restart waits longer before the next one
    os.kill(new, signal.SIGKILL)
    wait_until(lambda: f"worker (pid {new}) exited with signal 9; restarting it in 2s" in served.log(), timeout=30,
               what="the second restart backed off")
    wait_until(lambda: "worker restarted" in served.log().split(f"pid {new}) exited", 1)[1], timeout=60,
               what="the second restart")
    assert served.answers()


def test_sigterm_stops_every_child(served):
    children = wait_until(lambda: (c := served.children()) and len(c) == 5 and c, timeout=30, what="5 children")
    assert sorted(children.values()) == ["beat", "endpoint", "gateway", "web", "worker"]
    assert served.stop() == 0
    for pid in children:
        wait_until(lambda pid=pid: not alive(pid) and not group_members(pid), timeout=20,
                   what=f"{children[pid]} (pid {pid}) and its group gone")
    assert "restarted" not in served.log(), "stopping is not a death"


def cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")


def children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    return found


def test_the_web_is_gunicorn_with_the_configured_workers_serving_api_console_and_static_files(tmp_path):
    serve = ServeProcess(tmp_path / "data", concurrency=1, env={"MUSTER_WEB_WORKERS": "3"}).start()
    try:
        web = wait_until(lambda: serve.pid_of("web"), timeout=30, what="the web")
        # with setproctitle installed (smg, of the dev extra, needs it) gunicorn renames its master
        assert any(name in cmdline(web) for name in ("gunicorn muster.wsgi", "gunicorn: master [muster.wsgi]")) \
            and "runserver" not in cmdline(web), cmdline(web)
        workers = wait_until(lambda: len(children_of(web)) == 3 and children_of(web), timeout=30,
                             what="3 gunicorn workers")
        assert all("gunicorn" in cmdline(pid) for pid in workers)
        assert serve.api("GET", "runs/") is not None
        for path in ("/login/", "/static/admin/css/base.css", "/api/docs/"):
            with urllib.request.urlopen(f"{serve.url}{path}", timeout=10) as answer:
                assert answer.status == 200, path
        run_to_done(serve)
    finally:
        serve.stop()
    for pid in [web, *workers]:
        wait_until(lambda pid=pid: not alive(pid), timeout=20, what=f"web process {pid} gone")


def test_serve_dev_runs_the_development_server(tmp_path):
    serve = ServeProcess(tmp_path / "data", concurrency=1, args=("--dev",)).start()
    try:
        web = wait_until(lambda: serve.pid_of("web"), timeout=30, what="the web")
        assert "runserver" in cmdline(web) and "gunicorn" not in cmdline(web)
        assert serve.answers()
    finally:
        serve.stop()
