"""`muster apply` / `muster ps` of a service, against the fake server (the REST shapes are the real
server's: tests/api/test_service_submit.py): the plan's replicas and URL, the question before an
in-place update, the URL once submitted, and the service column of ps."""

from __future__ import annotations

import io
import sys

from cli import main as cli

SERVICE = "type: service\nname: web\nport: 8000\nreplicas: 2\ncommands: [python3 -m http.server 8000]\n"
URL = "http://127.0.0.1:8001/proxy/services/main/web/"
PLAN = {"run_name": "web", "configuration": {"groups": [{"name": "0", "commands": ["serve"]}]},
        "jobs": [{"job_num": 0, "node_group_name": "0", "node_group_index": 0, "node_group_rank": 0,
                  "replica_num": 0},
                 {"job_num": 1, "node_group_name": "0", "node_group_index": 0, "node_group_rank": 0,
                  "replica_num": 1}],
        "replicas": {"0": {"min": 2, "max": 2, "desired": 2}}, "service_url": URL, "capacity": {"fits": True,
        "fleet": "local", "reasons": [], "fleets": {"0": "local"}, "hosts": {"0": ["local-1", "local-2"]}},
        "warnings": [], "replaces": None, "updates": None}
RUN = {"name": "web", "status": "submitted", "deployment_num": 0, "jobs": [],
       "service": {"url": URL, "replicas": {"ready": 0, "total": 2}}}


def service_file(tmp_path) -> str:
    path = tmp_path / "service.yml"
    path.write_text(SERVICE)
    return str(path)


def test_apply_shows_the_replicas_submits_and_prints_the_url_without_following(api, tmp_path, capsys):
    api.on("POST", "runs/plan", (200, PLAN))
    api.on("POST", "runs/", (201, RUN))
    assert cli.main(["apply", "-f", service_file(tmp_path), "-y"]) == 0
    assert [(r.method, r.path) for r in api.requests] == [("POST", "runs/plan"), ("POST", "runs/")]
    assert "update" not in api.requests[1].body
    out = capsys.readouterr()
    assert f"Service web: {URL}" in out.out and "replica group 0: 2 replica(s)" in out.out
    assert f"Service URL: {URL}" in out.err and "muster stop web" in out.err


def test_apply_of_a_running_service_asks_before_updating_it(api, tmp_path, monkeypatch, capsys):
    updates = {"name": "web", "deployment_num": 1, "status": "running",
               "message": "service web is running: applying updates it in place (deployment 1)"}
    api.on("POST", "runs/plan", (200, {**PLAN, "updates": updates}))
    api.on("POST", "runs/", (200, {**RUN, "deployment_num": 1}))
    monkeypatch.setattr(sys, "stdin", io.StringIO("n\n"))
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True, raising=False)
    monkeypatch.setattr("builtins.input", lambda question: (capsys.readouterr(), print(question), "n")[2])
    assert cli.main(["apply", "-f", service_file(tmp_path)]) == 0
    assert api.calls("POST", "runs/") == []
    out = capsys.readouterr().out
    assert "Not updated." in out

    assert cli.main(["apply", "-f", service_file(tmp_path), "-y"]) == 0
    sent = api.calls("POST", "runs/")
    assert len(sent) == 1 and sent[0].body["update"] is True
    err = capsys.readouterr().err
    assert "deployment 1" in err and URL in err


def test_apply_of_a_routed_service_says_the_update_is_blue_green(api, tmp_path, capsys):
    updates = {"name": "web", "deployment_num": 1, "status": "running", "message": "blue/green: ..."}
    api.on("POST", "runs/plan", (200, {**PLAN, "updates": updates}))
    api.on("POST", "runs/", (200, {**RUN, "deployment_num": 1, "serving_deployment": 0}))
    assert cli.main(["apply", "-f", service_file(tmp_path), "-y"]) == 0
    err = capsys.readouterr().err
    assert "to deployment 1: it comes up beside deployment 0, which serves until the new one is ready" in err


def test_apply_says_why_a_running_run_of_the_name_cannot_be_updated(api, tmp_path, capsys):
    refused = {"name": "web", "refused": "run web is a task: only a service is updated in place"}
    api.on("POST", "runs/plan", (200, {**PLAN, "updates": refused}))
    assert cli.main(["apply", "-f", service_file(tmp_path), "-y"]) == 1
    assert api.calls("POST", "runs/") == []
    assert "only a service is updated in place" in capsys.readouterr().err


def test_ps_shows_a_service_s_url_and_ready_replicas(api, capsys):
    job = {"job_num": 1, "node_group_name": "0", "node_group_rank": 0, "replica_num": 1, "status": "running",
           "ready_at": "2030-01-01T00:00:00Z", "instance": "local-2", "instance_ip": "127.0.0.3", "probes": []}
    service = {**RUN, "status": "running", "submitted_at": None, "jobs": [job],
               "service": {"url": URL, "replicas": {"ready": 1, "total": 2}}}
    task = {"name": "t", "status": "running", "submitted_at": None, "jobs": [], "service": None}
    api.on("GET", "runs/", (200, [service, task]))
    assert cli.main(["ps"]) == 0
    out = capsys.readouterr().out
    assert "SERVICE" in out.splitlines()[0] and f"{URL} (1/2 ready)" in out
    assert cli.main(["ps", "-v"]) == 0
    line = next(row for row in capsys.readouterr().out.splitlines() if row.startswith("web"))
    assert "replica 1" in line and "yes" in line
