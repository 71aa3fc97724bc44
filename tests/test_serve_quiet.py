"""`muster serve` is quiet by default: a banner, then warnings and run state changes; the full
output of web, worker and beat goes to files in the data directory. `--verbose` brings it back."""

from __future__ import annotations

import pytest

from bench.soak import ServeProcess
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

FAILING = "type: task\nname: {name}\ncommands: [exit 3]\n"


@pytest.fixture
def quiet(tmp_path):
    serve = ServeProcess(tmp_path / "data", concurrency=1).start()
    yield serve
    serve.stop()


def test_the_terminal_shows_the_banner_and_run_state_changes_and_the_files_get_the_rest(quiet, tmp_path):
    done = quiet.submit("type: task\nname: quiet-ok\ncommands: [echo hi]\n")
    failed = quiet.submit(FAILING.format(name="quiet-bad"))
    wait_until(lambda: "main/run quiet-bad [failed]" in quiet.log() and "main/run quiet-ok [done]" in quiet.log(),
               timeout=120, what="both runs' ends on the terminal")
    assert (done, failed) == ("quiet-ok", "quiet-bad")

    out = quiet.log()
    logs = tmp_path / "data" / "serve-logs"
    # the banner: URLs, the admin's password, the token, and where the rest went
    assert "admin http://127.0.0.1:" in out and "admin user: admin / " in out and f"token: {quiet.token}" in out
    assert f"logs: web, worker and beat write to {logs}/" in out
    assert "main/run quiet-ok [submitted]" in out
    assert "development server" not in out
    # none of the worker's INFO chatter, none of the web's request lines
    assert "Task engine.tasks" not in out and "celery@" not in out and '"GET /healthz' not in out
    assert "Task engine.tasks.process_run" in (logs / "worker.log").read_text()
    assert '"GET /healthz' in (logs / "web.log").read_text()
    assert (logs / "beat.log").exists()


def test_verbose_shows_the_workers_output_on_the_terminal(tmp_path):
    serve = ServeProcess(tmp_path / "data", concurrency=1, args=("--verbose",)).start()
    try:
        name = serve.submit("type: task\ncommands: [echo hi]\n")
        wait_until(lambda: serve.status(name) == "done", timeout=120, what=f"run {name} done")
        wait_until(lambda: "Task engine.tasks.process_run" in serve.log(), timeout=30, what="the worker's lines")
        assert not (tmp_path / "data" / "serve-logs").exists()
    finally:
        serve.stop()
