"""The run page and the runs list through HTTP as a browser sends them (Django's test client, logged in
at /login/): the text as submitted with its secrets masked, whole status words, exit codes and run
times, events newest first, the log download, and the runs list's columns, filter and pages."""

from __future__ import annotations

import html
import re

import pytest

from tests.conftest import client_for
from tests.console.test_pages import _browser, _submit, _user

pytestmark = pytest.mark.django_db

WRITTEN = """# the prefill/decode split, as I wrote it
type: task
name: written
env:
  - TOKEN=${{ secrets.TOKEN }}
  - MODE=fast
groups:
  - name: prefill
    nodes: 2
    commands: [echo typed-in-s3cr3t-value]   # a secret's value typed by hand
  - {name: decode, nodes: 1, env: {TOKEN: "${{ secrets.TOKEN }}", LEVEL: 2}, commands: [echo d]}
"""


def _text_of(body: str, element_id: str) -> str:
    found = re.search(rf'<pre id="{element_id}"[^>]*>(.*?)</pre>', body, re.S)
    assert found, f"no #{element_id} on the page"
    return html.unescape(found.group(1))


def test_the_configuration_is_shown_as_the_user_wrote_it_with_every_secret_value_masked(make_user):
    alice = _user(make_user, "alice")
    api = client_for(alice)
    assert api.post("/api/projects/main/secrets/", {"name": "TOKEN", "value": "typed-in-s3cr3t-value"},
                    format="json").status_code == 201
    _submit(alice, WRITTEN)
    # a secret made after the run whose value is in the text is masked too
    assert api.post("/api/projects/main/secrets/", {"name": "LATER", "value": "MODE=fast"},
                    format="json").status_code == 201
    body = _browser(alice).get("/projects/main/runs/written/").content.decode()
    shown = _text_of(body, "configuration")
    assert "# the prefill/decode split, as I wrote it" in shown
    assert "{name: decode, nodes: 1, env: {TOKEN: ***, LEVEL: 2}, commands: [echo d]}" in shown
    assert "index: 0" not in shown and "image: null" not in shown
    assert "  - TOKEN=***\n" in shown and "secrets.TOKEN" not in shown
    assert "typed-in-s3cr3t-value" not in body and "echo ***" in shown
    assert "MODE=fast" not in body


def test_a_run_sent_as_a_json_object_with_request_env_shows_yaml_without_the_request_values(make_user):
    alice = _user(make_user, "alice")
    payload = {"configuration": {"type": "task", "name": "obj", "env": ["HF_TOKEN"],
                                 "commands": ["echo hf_request_value_123"]},
               "env": {"HF_TOKEN": "hf_request_value_123"}}
    assert client_for(alice).post("/api/projects/main/runs/", payload, format="json").status_code == 201
    from runs.models import Run

    assert "hf_request_value_123" not in Run.objects.get(name="obj").submitted_text
    shown = _text_of(_browser(alice).get("/projects/main/runs/obj/").content.decode(), "configuration")
    assert "name: obj" in shown and "HF_TOKEN" in shown and "echo ***" in shown


def _finish(run, job_num, **fields):
    from runs.models import Job

    Job.objects.filter(run=run, job_num=job_num).update(**fields)


def test_a_long_status_word_is_drawn_whole_and_each_job_shows_its_exit_code_and_run_time(make_user):
    from runs.choices import JobStatus
    from runs.models import Run

    alice = _user(make_user, "alice")
    _submit(alice, "type: task\nname: long\nnodes: 2\ncommands: [exit 3]\n")
    run = Run.objects.get(name="long")
    reason = "container_exited_with_error_after_a_long_wait"  # longer than a line of the picture
    _finish(run, 0, status=JobStatus.FAILED, termination_reason=reason, exit_status=3, start_time=1000.0,
            end_time=1125.0)
    body = _browser(alice).get("/projects/main/runs/long/").content.decode()
    node = body[body.index('<g class="node" data-job="0"'):]
    node = node[:node.index("</g>")]
    drawn = "".join(re.findall(r"<tspan[^>]*>([^<]*)</tspan>", node))
    assert drawn.replace(" ", "") == f"failed({reason})", drawn
    assert all(len(line) <= 30 for line in re.findall(r"<tspan[^>]*>([^<]*)</tspan>", node))
    assert "exit 3 · ran 2m 05s" in node
    row = body[body.index('<tr data-job="0">'):]
    row = row[:row.index("</tr>")]
    assert '<td class="exit">3</td>' in row and '<td class="ran">2m 05s</td>' in row
    other = body[body.index('<tr data-job="1">'):]
    assert '<td class="exit">-</td>' in other[:other.index("</tr>")]


def test_events_are_listed_newest_first_and_say_so(make_user):
    from events.services import record
    from runs.models import Run

    alice = _user(make_user, "alice")
    _submit(alice, "type: task\nname: ev\ncommands: [echo]\n")
    run = Run.objects.get(name="ev")
    record(run.project_id, "run ev", "a later event", run_id=run.id)
    body = _browser(alice).get("/projects/main/runs/ev/").content.decode()
    events = body[body.index('id="events"'):]
    assert events.index("a later event") < events.index("submitted with 1 jobs")
    assert "newest first" in body[body.index("<h2>Events"):body.index('id="events"')]


def _stored_log(job, text: bytes):
    from runs.services import logs

    path = logs.stored_path(job)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text)


def test_the_whole_log_downloads_as_text_for_one_job_or_every_job_with_group_rank_prefixes(make_user):
    from runs.models import Run

    alice = _user(make_user, "alice")
    _submit(alice, "type: task\nname: logs\ngroups:\n  - {name: router, nodes: 1, commands: [echo]}\n"
                   "  - {name: worker, nodes: 2, commands: [echo]}\n")
    run = Run.objects.get(name="logs")
    jobs = list(run.current_jobs())
    big = b"".join(b"line %d of the router\n" % i for i in range(100_000))  # past one read's 1 MiB chunk
    _stored_log(jobs[0], big)
    _stored_log(jobs[1], b"worker zero says hi\nno newline at the end")
    browser = _browser(alice)
    one = browser.get("/projects/main/runs/logs/log.txt?job=0")
    assert one.status_code == 200 and one["Content-Type"].startswith("text/plain")
    assert 'attachment; filename="logs-job0.log"' == one["Content-Disposition"]
    assert b"".join(one.streaming_content) == big
    every = b"".join(browser.get("/projects/main/runs/logs/log.txt").streaming_content).decode()
    lines = every.splitlines()
    assert len(lines) == 100_002
    assert lines[0] == "[router/0] line 0 of the router" and lines[99_999] == "[router/0] line 99999 of the router"
    assert lines[-2:] == ["[worker/0] worker zero says hi", "[worker/0] no newline at the end"]
    bad = browser.get("/projects/main/runs/logs/log.txt?job=x")
    assert bad.status_code == 400 and bad.json()["errors"][0]["loc"] == ["job"]
    assert browser.get("/projects/main/runs/logs/log.txt?job=7").status_code == 404
    outsider = _browser(_user(make_user, "mallory", project="other"))
    assert outsider.get("/projects/main/runs/logs/log.txt").status_code == 404


def test_the_runs_list_shows_nodes_gpus_who_submitted_and_duration(make_user):
    from datetime import timedelta

    from runs.choices import RunStatus
    from runs.models import Run

    alice = _user(make_user, "alice")
    _submit(alice, "type: task\nname: gpus\ngroups:\n  - {name: a, nodes: 2, resources: {gpu: A100:2}, "
                   "commands: [x]}\n  - {name: b, nodes: 1, commands: [y]}\n")
    run = Run.objects.get(name="gpus")
    Run.objects.filter(pk=run.pk).update(status=RunStatus.DONE, finished_at=run.submitted_at + timedelta(seconds=95))
    body = _browser(alice).get("/").content.decode()
    row = body[body.index('<tr data-run="gpus">'):]
    row = row[:row.index("</tr>")]
    assert '<td class="nodes">3</td>' in row
    assert '<td class="gpus">4x A100</td>' in row
    assert '<td class="user">alice</td>' in row
    assert '<td class="duration">1m 35s</td>' in row


def test_the_runs_list_filters_by_status_and_pages_through_many_runs(make_user):
    from runs.choices import RunStatus
    from runs.models import Run

    alice = _user(make_user, "alice")
    for i in range(55):
        _submit(alice, f"type: task\nname: r{i:02d}\ncommands: [echo]\n")
    Run.objects.filter(name__in=["r03", "r04"]).update(status=RunStatus.FAILED)
    browser = _browser(alice)
    first = browser.get("/").content.decode()
    assert first.count('<tr data-run="') == 50 and 'data-run="r54"' in first and 'data-run="r04"' not in first
    assert "page 1 of 2" in first and 'href="?page=2"' in first
    second = browser.get("/?page=2").content.decode()
    assert second.count('<tr data-run="') == 5 and 'data-run="r00"' in second
    failed = browser.get("/?status=failed").content.decode()
    assert re.findall(r'<tr data-run="([^"]+)"', failed) == ["r04", "r03"]
    bad = browser.get("/?status=broken")
    assert bad.status_code == 400
    assert bad.json()["errors"][0]["loc"] == ["status"] and "running" in bad.json()["errors"][0]["msg"]
    assert browser.get("/?page=zero").status_code == 400
