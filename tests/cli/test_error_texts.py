"""Error texts as a newcomer meets them through the `muster` CLI (its own process, a live server):
where the problem is and what to do, never a traceback, an HTML page or a doubled field name."""

from __future__ import annotations

import http.server
import subprocess
import threading
from pathlib import Path

import pytest

from tests.cli.test_cli_live import MUSTER, local_fleet, muster, write  # noqa: F401 - fixtures
from tests.engine.helpers import wait_for_run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_an_unquoted_colon_in_a_command_names_the_file_the_line_and_says_to_quote_it(muster, tmp_path):  # noqa: F811
    path = write(tmp_path, "type: task\nname: colon\ncommands:\n  - echo starting\n  - echo result: ok\n")
    plan = muster("plan", "-f", path)
    assert plan.returncode == 1
    assert plan.stderr.splitlines() == [
        f"error: {path}: line 5: the command `echo result: ok` holds `: `, so YAML reads it as a mapping, not a "
        "command: quote the command, e.g. - \"echo result: ok\""], plan.stderr


def test_the_api_says_to_quote_a_command_read_as_a_mapping(make_user):
    from rest_framework.test import APIClient

    from tests.conftest import token_for

    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {token_for(make_user('alice'))}")
    resp = api.post("/api/projects/main/runs/plan",
                    {"configuration": "type: task\ncommands:\n  - echo result: ok\n"}, format="json")
    assert resp.status_code == 400
    (error,) = resp.json()["errors"]
    assert error["loc"] == ["commands", 0] and "quote the command" in error["msg"], error


@pytest.mark.parametrize("resources, said", [
    ("cpu: {}", "error: resources.cpu: a range needs at least one of min and max"),
    ("cpu: {min: 2, foo: 3}", "error: resources.cpu: unknown key `foo` in cpu: the object form takes arch and "
                              "count (or min and max, a range)"),
    ("gpu: {name: A100, count: {min: 1, max: 2, most: 3}}",
     "error: resources.gpu.count: unknown key `most`: a range object takes min and max"),
])
def test_a_field_is_named_once_not_again_in_front_of_its_message(muster, tmp_path, resources, said):  # noqa: F811
    plan = muster("plan", "-f", write(tmp_path, f"type: task\ncommands: [echo]\nresources:\n  {resources}\n"))
    assert plan.returncode == 1 and plan.stderr.splitlines() == [said], plan.stderr


def test_a_wrong_token_is_said_in_the_one_error_shape_with_the_hint(muster):  # noqa: F811
    ps = subprocess.run([*MUSTER, "ps"], env={**muster.env, "MUSTER_TOKEN": "not-a-token"}, capture_output=True,
                        text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert ps.returncode == 1
    (line,) = ps.stderr.splitlines()
    assert line.startswith("error: invalid or expired token") and line.endswith(
        "(check MUSTER_TOKEN or `muster config`)"), ps.stderr


@pytest.fixture
def docs_site():
    """A web server that is not Muster: HTML for every path (200 on /docs/..., 404 elsewhere)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            page = b"<!DOCTYPE html>\n<html><head><title>Muster docs</title></head><body>" + b"x" * 2000 + \
                b"</body></html>\n"
            self.send_response(200 if self.path.startswith("/docs/") else 404)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("path", ["/docs", "/elsewhere"])
def test_muster_url_set_to_a_page_that_is_not_the_api_says_so_instead_of_printing_it(muster, docs_site, path):  # noqa: F811
    ps = subprocess.run([*MUSTER, "ps"], env={**muster.env, "MUSTER_URL": docs_site + path}, capture_output=True,
                        text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert ps.returncode == 1, ps.stderr
    (line,) = ps.stderr.splitlines()
    assert line.startswith(f"error: {docs_site}{path} is not a Muster API: it answered HTTP ") and \
        "with an HTML page" in line and "MUSTER_URL" in line, ps.stderr
    assert "<html" not in ps.stderr.lower() and "Traceback" not in ps.stderr


def test_attach_to_a_run_that_does_not_exist_makes_no_key(muster):  # noqa: F811
    attach = muster("attach", "nope")
    assert attach.returncode == 1
    assert attach.stderr.splitlines() == ["error: run nope not found in project main"], attach.stderr
    assert not (Path(muster.env["HOME"]) / ".muster" / "attach_key").exists()


def test_the_ports_warning_points_to_muster_attach(muster, tmp_path):  # noqa: F811
    plan = muster("plan", "-f", write(tmp_path, "type: task\nname: web\nports: [8000]\ncommands: [echo]\n"))
    assert plan.returncode == 0, plan.stderr
    assert "muster attach RUN` forwards them to localhost" in plan.stdout, plan.stdout


def test_reapplying_a_finished_runs_name_says_it_replaces_it_and_the_new_history_says_so(
        muster, local_fleet, celery_worker, tmp_path):  # noqa: F811
    path = write(tmp_path, "type: task\nname: again\ncommands: [seq 300000]\n")
    first = muster("apply", "-f", path, "-y", "-d")
    assert first.returncode == 0, first.stderr
    assert wait_for_run("again").status == "done"
    assert "replaces" not in first.stdout

    # a reader that stops early (`| head`): no traceback, no BrokenPipeError
    head = subprocess.run(["sh", "-c", " ".join(f"'{a}'" for a in MUSTER) + " logs again | head -n 2"],
                          env=muster.env, capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    assert head.stdout == "[default/0] 1\n[default/0] 2\n" and head.stderr == "", head.stderr[-3000:]

    second = muster("apply", "-f", path, "-y", "-d")
    assert second.returncode == 0, second.stderr
    assert ("Note: run again exists and has ended (done): submitting replaces it, as dstack does; its jobs, logs "
            "and events are deleted (pick another name to keep it)") in second.stdout, second.stdout
    events = muster("events", "again")
    assert "replacing the run of this name that had ended (done, submitted " in events.stdout, events.stdout
