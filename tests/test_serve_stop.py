"""Ctrl-C of `muster serve` (`make run`) as a real process: it says at once that it stops, each child
ends on its own (the worker by Celery's warm shutdown, none killed), and it exits 130 like any
interrupted command. SIGINT goes to serve alone, as the terminal sends it: the children lead their
own sessions."""

from __future__ import annotations

import os
import signal

import pytest

from bench.soak import ServeProcess
from tests.test_serve import alive, group_members
from tests.waiting import patient, wait_until

pytestmark = pytest.mark.slow


def test_ctrl_c_says_so_at_once_stops_every_child_without_a_kill_and_exits_130(tmp_path):
    serve = ServeProcess(tmp_path / "data", concurrency=1).start()
    try:
        name = serve.submit()
        wait_until(lambda: serve.status(name) == "done", timeout=120, what=f"run {name} done")
        children = wait_until(lambda: (c := serve.children()) and len(c) == 5 and c, timeout=30, what="5 children")
        worker_log = tmp_path / "data" / "serve-logs" / "worker.log"
        wait_until(lambda: "ready." in worker_log.read_text(errors="replace"), timeout=60, what="the worker ready")

        os.kill(serve.proc.pid, signal.SIGINT)
        code = serve.proc.wait(timeout=patient(60))
    finally:
        serve.stop()
    log = serve.log()
    assert code == 130, log[-3000:]
    said = log.find("muster serve: stopping web, worker, beat, gateway, endpoint...")
    assert said != -1, log[-3000:]
    for child in ("web", "worker", "beat", "gateway", "endpoint"):
        assert log.find(f"muster serve: {child} stopped (") > said, log[-3000:]
    assert "did not stop in time" not in log and "killing it" not in log, log[-3000:]
    assert "signal 9" not in log, log[-3000:]
    assert "Warm shutdown" in worker_log.read_text(errors="replace")
    for pid in children:
        wait_until(lambda pid=pid: not alive(pid) and not group_members(pid), timeout=20,
                   what=f"{children[pid]} (pid {pid}) and its group gone")
