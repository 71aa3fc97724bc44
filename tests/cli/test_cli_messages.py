"""Exit statuses and messages of the `muster` CLI (issue 20, item 8), as a user meets them: the
real CLI in its own process against a live server (and, where a run must run, a real Celery
worker and the local backend's runner agents)."""

from __future__ import annotations

import json
import signal
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from runs.models import Run
from tests.cli.test_cli_live import MUSTER, local_fleet, muster, write  # noqa: F401 - fixtures
from tests.engine.helpers import runner_processes, wait_for_run
from tests.local_processes import as_from_a_terminal
from tests.waiting import patient, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _errors(result: subprocess.CompletedProcess[str]) -> list[str]:
    return result.stderr.splitlines()


def test_ctrl_c_during_apply_exits_130_and_says_the_run_goes_on(muster, local_fleet, celery_worker, tmp_path):  # noqa: F811
    conf = "type: task\nname: goes-on\nnodes: 1\ncommands: [echo started, sleep 431]\n"
    apply = subprocess.Popen([*MUSTER, "apply", "-f", write(tmp_path, conf), "-y"], env=muster.env, text=True,
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             preexec_fn=as_from_a_terminal)
    try:
        wait_for_run("goes-on", statuses=("running",), timeout=90)
        wait_until(lambda: runner_processes("sleep 431"), timeout=90, what="the run's command running")
        time.sleep(1.5)  # a follow tick has seen it running
        apply.send_signal(signal.SIGINT)
        out, err = apply.communicate(timeout=patient(30))
    finally:
        apply.kill()

    assert apply.returncode == 130, err
    assert "run goes-on continues on the server" in err, err
    assert "muster logs goes-on" in err and "muster stop goes-on" in err, err
    assert "Traceback" not in err
    assert Run.objects.get(name="goes-on").status == "running", "Ctrl-C stops the following, not the run"
    assert muster("stop", "goes-on", "-y", "--abort").returncode == 0
    wait_for_run("goes-on")


def test_a_run_that_does_not_exist_is_named_with_its_project(muster, live_server):  # noqa: F811
    for args in (["logs", "nope"], ["events", "nope"], ["stop", "nope", "-y"], ["delete", "nope", "-y"]):
        result = muster(*args)
        assert result.returncode == 1, args
        assert _errors(result) == ["error: run nope not found in project main"], (args, result.stderr)

    request = urllib.request.Request(f"{live_server.url}/api/projects/main/runs/nope/",
                                     headers={"Authorization": f"Token {muster.env['MUSTER_TOKEN']}"})
    with pytest.raises(urllib.error.HTTPError) as answer:
        urllib.request.urlopen(request, timeout=30)
    assert answer.value.code == 404
    # the one error shape of the API (docs/api.md), for a lookup as for bad input
    assert json.loads(answer.value.read()) == {"errors": [{"loc": [], "msg": "run nope not found in project main"}]}


def test_a_configuration_without_type_says_type_is_missing(muster, live_server, tmp_path):  # noqa: F811
    plan = muster("plan", "-f", write(tmp_path, "commands: [echo]\n"))
    assert plan.returncode == 1
    assert _errors(plan) == [f"error: {tmp_path / 'task.yml'}: missing `type:`: write `type: task` (a run), "
                             "`type: service` or `type: fleet`"]
    assert "None" not in muster("apply", "-f", write(tmp_path, "type:\ncommands: [echo]\n"), "-y").stderr

    request = urllib.request.Request(
        f"{live_server.url}/api/projects/main/runs/plan", method="POST",
        data=json.dumps({"configuration": "type:\ncommands: [echo]\n"}).encode(),
        headers={"Authorization": f"Token {muster.env['MUSTER_TOKEN']}", "Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as answer:
        urllib.request.urlopen(request, timeout=30)
    assert answer.value.code == 400
    assert json.loads(answer.value.read())["errors"] == [
        {"loc": ["type"], "msg": "missing `type:`: write `type: task` or `type: service`"}]


def test_a_yaml_error_is_one_line_naming_the_file_and_line(muster, tmp_path):  # noqa: F811
    path = write(tmp_path, "type: task\ncommands: [echo hi\n")
    result = muster("plan", "-f", path)
    assert result.returncode == 1
    # libyaml's words (cli/strict_yaml.py loads with PyYAML's C parser)
    assert _errors(result) == [f"error: {path}: line 3, column 1: invalid YAML: did not find expected ',' or ']' "
                               "(while parsing a flow sequence from line 2)"]


def test_a_key_written_twice_is_named_with_the_file_and_line_before_anything_is_sent(muster, tmp_path):  # noqa: F811
    path = write(tmp_path, "type: task\nname: first\ncommands: [echo]\nname: second\n")
    result = muster("apply", "-f", path, "-y")
    assert result.returncode == 1
    assert _errors(result) == [f"error: {path}: line 4, column 1: invalid YAML: duplicate key `name`"]
    assert not Run.objects.exists()


def test_unknown_keys_and_commands_say_what_was_meant(muster, tmp_path):  # noqa: F811
    result = muster("plan", "-f", write(tmp_path, "type: task\ncomands: [echo]\n"))
    assert result.returncode == 1
    assert _errors(result) == ["error: comands: unknown key `comands`: did you mean `commands`?"]
    grouped = "type: task\ngroups:\n  - name: a\n    commands: [echo]\n    resorces: {cpu: 1}\n"
    assert _errors(muster("plan", "-f", write(tmp_path, grouped))) == [
        "error: groups[0].resorces: unknown key `resorces`: did you mean `resources`?"]

    typo = muster("aply", "-f", "x.yml")
    assert typo.returncode == 2
    assert typo.stderr.splitlines()[-1].endswith("invalid choice: 'aply' (choose from 'config', 'apply', 'plan', "
                                                 "'ps', 'logs', 'metrics', 'queue', 'attach', 'ssh', 'events', 'delete', 'stop', 'fleet', "
                                                 "'instances', 'serve'); did you mean `apply`?"), typo.stderr


def test_every_server_error_is_one_line_with_its_field_path(muster, tmp_path):  # noqa: F811
    conf = "type: task\nnodes: 2\ngroups:\n  - name: a\n    comands: [echo]\n"
    result = muster("plan", "-f", write(tmp_path, conf))
    assert result.returncode == 1
    assert _errors(result) == [
        "error: groups[0].comands: unknown key `comands`: did you mean `commands`?",
        "error: nodes: `nodes` and `groups` cannot be used together: set `nodes` in each group"]


def test_muster_url_without_a_scheme_is_refused_and_one_ending_in_api_is_taken(muster, live_server, tmp_path):  # noqa: F811
    def ps(url: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*MUSTER, "ps"], env={**muster.env, "MUSTER_URL": url}, capture_output=True,
                              text=True, timeout=60, stdin=subprocess.DEVNULL)

    bare = live_server.url.removeprefix("http://")
    refused = ps(bare)
    assert refused.returncode == 1
    assert _errors(refused) == [f"error: MUSTER_URL '{bare}' has no scheme: write http://{bare} (or https://{bare})"]
    for url in (f"{live_server.url}/api", f"{live_server.url}/api/", f"{live_server.url}/"):
        taken = ps(url)
        assert (taken.returncode, taken.stdout) == (0, "No runs.\n"), (url, taken.stderr)

    saved = subprocess.run([*MUSTER, "config", "--url", bare, "--token", "t"], env=muster.env,
                           capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert saved.returncode == 1 and "--url" in saved.stderr and "has no scheme" in saved.stderr
