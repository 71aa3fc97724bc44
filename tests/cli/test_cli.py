"""The `muster` CLI against a fake server that speaks the REST contract over real HTTP."""

from __future__ import annotations

import io
import json
import os
import stat
import sys
from types import SimpleNamespace

import yaml

from cli import fleets
from cli import follow as cli_follow
from cli import main as cli

TASK = """\
type: task
name: r1
env: [HF_TOKEN, MODEL_ID=llama]
groups:
  - name: router
    nodes: 1
    env: [ROUTER_SECRET]
    commands:
      - smg launch --prefill http://${{ groups[1].nodes[0].IP_ADDRESS }}:8000
      - echo second
  - name: workers
    nodes: 1
    resources: {gpu: L40S}
    commands: [python -m worker]
"""

PLAN = {
    "run_name": "r1",
    "configuration": {},
    "jobs": [
        {"job_num": 0, "node_group_name": "router", "node_group_index": 0, "node_group_rank": 0,
         "resources": {"cpu": {"min": 4, "max": 4, "arch": "x86"}, "memory": {"min": 1.0, "max": None},
                       "disk": {"min": 1.0, "max": None}, "gpu": None},
         "commands": ["smg launch --prefill http://${{ groups[1].nodes[0].IP_ADDRESS }}:8000", "echo second"],
         "env": {}, "image": None, "ports": [8000]},
        {"job_num": 1, "node_group_name": "workers", "node_group_index": 1, "node_group_rank": 0,
         "resources": {"cpu": {"min": 1, "max": None, "arch": "x86"}, "memory": {"min": 1.0, "max": None},
                       "disk": {"min": 1.0, "max": None},
                       "gpu": {"vendor": "nvidia", "names": ["L40S"], "count": {"min": 1, "max": 1},
                               "memory": None, "tpu": None}},
         "commands": ["python -m worker"], "env": {}, "image": None, "ports": []},
    ],
}


def job(num: int, status: str, group: str = "workers", **extra) -> dict:
    return {"job_num": num, "status": status, "termination_reason": None, "termination_message": None,
            "node_group_name": group, "node_group_rank": num, "instance": None, "instance_ip": None, **extra}


def run(status: str, jobs: list[dict], name: str = "r1", **extra) -> dict:
    return {"name": name, "status": status, "termination_reason": None, "termination_message": None,
            "fleet": "f1", "submission_num": 0, "submitted_at": "2025-01-01T00:00:00+00:00", "jobs": jobs, **extra}


def task_file(tmp_path, text: str = TASK):
    path = tmp_path / "task.yml"
    path.write_text(text)
    return str(path)


def serve_log(text: str, statuses: list[str] | None = None):
    """A logs endpoint serving `text` a few bytes at a time from the requested offset."""
    data = text.encode()
    seen = {"n": 0}

    def answer(request):
        start = int(request.query["start"])
        chunk = data[start:start + 7]
        states = statuses or ["running"]
        status = states[min(seen["n"], len(states) - 1)]
        seen["n"] += 1
        return 200, {"job": int(request.query.get("job", 0)), "start": start, "next": start + len(chunk),
                     "status": status, "text": chunk.decode()}

    return answer


# ---- settings ------------------------------------------------------------------------------------


def test_environment_overrides_config_file_setting_by_setting(home, monkeypatch):
    (home / ".muster").mkdir()
    (home / ".muster" / "config").write_text("url: http://file:1\ntoken: file-token\nproject: fromfile\n")
    monkeypatch.setenv("MUSTER_URL", "http://env:2/")

    settings = cli.load_settings()

    assert settings == cli.Settings(url="http://env:2", token="file-token", project="fromfile")
    monkeypatch.setenv("MUSTER_PROJECT", "fromenv")
    assert cli.load_settings().project == "fromenv"
    assert cli.load_settings("fromflag").project == "fromflag"


def test_project_defaults_to_main(home, monkeypatch):
    monkeypatch.setenv("MUSTER_URL", "http://x")
    monkeypatch.setenv("MUSTER_TOKEN", "t")
    assert cli.load_settings().project == "main"


def test_no_server_configured_says_how_to_configure(home, capsys):
    assert cli.main(["ps"]) == 1
    assert "muster config --url" in capsys.readouterr().err


def test_config_command_writes_a_private_file_used_by_later_commands(api, home, monkeypatch, capsys):
    monkeypatch.delenv("MUSTER_URL")
    monkeypatch.delenv("MUSTER_TOKEN")
    api.on("GET", "runs/", (200, []))

    assert cli.main(["config", "--url", api.url, "--token", "saved-token", "--project", "p1"]) == 0
    path = home / ".muster" / "config"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert yaml.safe_load(path.read_text()) == {"url": api.url, "token": "saved-token", "project": "p1"}

    assert cli.main(["ps"]) == 0
    (request,) = api.calls("GET", "runs/")
    assert request.project == "p1"
    assert request.headers["Authorization"] == "Token saved-token"


# ---- apply: tasks ------------------------------------------------------------------------------------


def test_apply_detached_posts_plan_then_run_with_file_text_and_filled_env(api, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ROUTER_SECRET", "from-local-env")
    monkeypatch.setenv("HF_TOKEN", "local-value-loses-to-flag")
    monkeypatch.setenv("UNRELATED_SECRET", "never-sent")
    api.on("POST", "runs/plan", (200, PLAN))
    api.on("POST", "runs/", (201, run("submitted", [job(0, "submitted", "router"), job(1, "submitted")])))

    code = cli.main(["apply", "-f", task_file(tmp_path), "-y", "--detach", "--env", "HF_TOKEN=hf-123"])

    assert code == 0
    assert [(r.method, r.path) for r in api.requests] == [("POST", "runs/plan"), ("POST", "runs/")]
    expected = {"configuration": TASK, "env": {"HF_TOKEN": "hf-123", "ROUTER_SECRET": "from-local-env"}}
    assert [r.body for r in api.requests] == [expected, expected]
    assert api.requests[0].headers["Authorization"] == "Token test-token"
    out = capsys.readouterr()
    assert "smg launch --prefill" in out.out and "(+1 more)" in out.out
    assert "gpu L40S:1" in out.out
    assert "muster logs r1" in out.err


def test_apply_without_yes_refuses_when_stdin_is_not_a_terminal(api, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))
    api.on("POST", "runs/plan", (200, PLAN))

    assert cli.main(["apply", "-f", task_file(tmp_path)]) == 1

    assert api.calls("POST", "runs/") == []
    assert "-y" in capsys.readouterr().err


def test_apply_follows_the_run_until_done_and_prints_each_jobs_log_once_prefixed(api, tmp_path, capsys):
    log = "loading model\nserving on :8000\nbye\n"
    api.on("POST", "runs/plan", (200, PLAN))
    api.on("POST", "runs/", (201, run("submitted", [job(0, "submitted"), job(1, "submitted")])))
    api.on(
        "GET", "runs/r1/",
        (200, run("provisioning", [job(0, "provisioning"), job(1, "provisioning")])),
        (200, run("running", [job(0, "running", instance="h0", instance_ip="10.0.0.1"), job(1, "provisioning")])),
        (200, run("running", [job(0, "running", instance="h0", instance_ip="10.0.0.1"), job(1, "running")])),
        (200, run("done", [job(0, "done"), job(1, "done")], termination_reason="all_jobs_done")),
    )
    api.on("GET", "runs/r1/logs", serve_log(log))

    assert cli.main(["apply", "-f", task_file(tmp_path), "-y"]) == 0

    out = capsys.readouterr()
    for rank in (0, 1):
        assert out.out.count(f"[workers/{rank}] loading model\n[workers/{rank}] serving on :8000\n"
                             f"[workers/{rank}] bye\n") == 1
    assert out.out.count("loading model") == 2
    assert "job 0 (workers/0): running on h0 (10.0.0.1)" in out.err
    assert "run r1: running  jobs: 1 running, 1 provisioning" in out.err
    assert "run r1: done" in out.err
    assert {r.query["job"] for r in api.calls("GET", "runs/r1/logs")} == {"0", "1"}


def test_apply_exits_1_when_the_run_fails_and_prints_the_reason(api, tmp_path, capsys):
    failed = run("failed", [job(0, "failed", termination_reason="container_exited_with_error",
                                termination_message="exit status 3"), job(1, "terminated")],
                 termination_reason="job_failed", termination_message="job 0 failed")
    api.on("POST", "runs/plan", (200, PLAN))
    api.on("POST", "runs/", (201, run("submitted", [job(0, "submitted")])))
    api.on("GET", "runs/r1/", (200, run("running", [job(0, "running")])), (200, failed))
    api.on("GET", "runs/r1/logs", serve_log("Traceback\n"))

    assert cli.main(["apply", "-f", task_file(tmp_path), "-y"]) == 1

    err = capsys.readouterr().err
    assert "run r1: failed (job_failed): job 0 failed" in err
    assert "job 0 (workers/0): exit status 3" in err
    assert "last lines of job 0 (workers/0):\n  | Traceback" in err


def test_ctrl_c_while_following_exits_130_and_says_how_to_reattach(api, tmp_path, monkeypatch, capsys):
    def interrupted(_seconds):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_follow, "time", SimpleNamespace(sleep=interrupted))
    api.on("POST", "runs/plan", (200, PLAN))
    api.on("POST", "runs/", (201, run("submitted", [job(0, "submitted")])))
    api.on("GET", "runs/r1/", (200, run("running", [job(0, "running")])))
    api.on("GET", "runs/r1/logs", serve_log(""))

    assert cli.main(["apply", "-f", task_file(tmp_path), "-y"]) == 130

    assert "muster logs r1" in capsys.readouterr().err
    assert api.calls("POST", "runs/r1/stop") == []


def test_validation_errors_are_printed_with_their_location(api, tmp_path, capsys):
    errors = [{"loc": ["configuration", "groups", 0, "commands", 1], "msg": "groups[5] does not exist"},
              {"loc": [], "msg": "something general"}]
    api.on("POST", "runs/plan", (400, {"errors": errors}))

    assert cli.main(["apply", "-f", task_file(tmp_path), "-y"]) == 1

    err = capsys.readouterr().err
    assert "error: configuration.groups[0].commands[1]: groups[5] does not exist\n" in err
    assert "error: something general\n" in err
    assert api.calls("POST", "runs/") == []


def test_malformed_env_flag_is_a_usage_error(api, tmp_path, capsys):
    assert cli.main(["apply", "-f", task_file(tmp_path), "-y", "--env", "NOVALUE"]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err
    assert api.requests == []


def test_unsupported_type_is_refused_before_any_request(api, tmp_path, capsys):
    assert cli.main(["apply", "-f", task_file(tmp_path, "type: dev-environment\nname: s\n"), "-y"]) == 1
    assert "dev-environment" in capsys.readouterr().err
    assert api.requests == []


# ---- fleets ----------------------------------------------------------------------------------------


FLEET = """\
type: fleet
name: pd
placement: cluster
ssh_config:
  user: ubuntu
  identity_file: ~/.ssh/id_test
  hosts:
    - 10.0.0.10
    - hostname: 10.0.0.11
      identity_file: keys/other
"""


def test_fleet_identity_files_are_sent_as_key_contents(api, home, tmp_path, capsys):
    (home / ".ssh").mkdir()
    (home / ".ssh" / "id_test").write_text("MAIN KEY\n")
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "other").write_text("OTHER KEY\n")
    fleet_file = tmp_path / "fleet.yml"
    fleet_file.write_text(FLEET)
    api.on("POST", "fleets/", (201, {"name": "pd", "backend": "ssh", "placement": "cluster", "status": "active",
                                     "instances": [{"name": "pd-0", "status": "provisioning", "internal_ip": None}]}))

    assert cli.main(["fleet", "apply", "-f", str(fleet_file)]) == 0

    (request,) = api.calls("POST", "fleets/")
    ssh = request.body["configuration"]["ssh_config"]
    assert ssh["private_key"] == "MAIN KEY\n"
    assert ssh["hosts"] == ["10.0.0.10", {"hostname": "10.0.0.11", "private_key": "OTHER KEY\n"}]
    assert "identity_file" not in json.dumps(request.body)
    assert "fleet pd: active" in capsys.readouterr().out


def test_missing_identity_file_is_reported_before_any_request(api, tmp_path, capsys):
    fleet_file = tmp_path / "fleet.yml"
    fleet_file.write_text(FLEET)

    assert cli.main(["apply", "-f", str(fleet_file)]) == 1

    assert "ssh_config.identity_file" in capsys.readouterr().err
    assert api.requests == []


def test_fleet_without_identity_files_is_sent_as_written(api, tmp_path):
    text = "type: fleet\nname: tpu\nbackends: [gcp]\nresources: {gpu: tpu-v2-32}\n"
    fleet_file = tmp_path / "fleet.yml"
    fleet_file.write_text(text)
    api.on("POST", "fleets/", (201, {"name": "tpu", "status": "active", "instances": []}))

    assert cli.main(["apply", "-f", str(fleet_file)]) == 0

    assert api.calls("POST", "fleets/")[0].body == {"configuration": text}


def test_fleet_delete_passes_force(api, capsys):
    api.on("DELETE", "fleets/pd/", (202, {"name": "pd", "status": "terminating"}))
    api.on("GET", "fleets/", (200, []))

    assert cli.main(["fleet", "delete", "pd", "--force", "-y"]) == 0

    assert api.calls("DELETE", "fleets/pd/")[0].query == {"force": "true"}


def test_fleet_delete_waits_until_the_server_has_removed_the_fleet(api, capsys, monkeypatch):
    monkeypatch.setattr(fleets, "POLL_SECONDS", 0.01)
    api.on("DELETE", "fleets/pd/", (202, {"name": "pd", "status": "terminating"}))
    terminating = [{"name": "pd", "status": "terminating", "instances": []}, {"name": "other", "status": "active"}]
    api.on("GET", "fleets/", (200, terminating), (200, terminating), (200, [{"name": "other", "status": "active"}]))

    assert cli.main(["fleet", "delete", "pd", "-y"]) == 0

    assert len(api.calls("GET", "fleets/")) == 3, "asked until the fleet was gone"
    assert capsys.readouterr().out.splitlines()[-1] == "Fleet pd: deleted"


def test_fleet_delete_gives_up_waiting_with_a_message_that_says_the_server_goes_on(api, capsys, monkeypatch):
    api.on("DELETE", "fleets/pd/", (202, {"name": "pd", "status": "terminating"}))
    api.on("GET", "fleets/", (200, [{"name": "pd", "status": "terminating"}]))
    monkeypatch.setattr(fleets, "FLEET_DELETE_WAIT_SECONDS", 0.0)

    assert cli.main(["fleet", "delete", "pd", "-y"]) == 1

    assert "still being deleted" in capsys.readouterr().err


def test_fleet_list_shows_instance_counts(api, capsys):
    api.on("GET", "fleets/", (200, [{"name": "pd", "backend": "ssh", "placement": "cluster", "status": "active",
                                     "instances": [{"name": "a", "status": "idle"}, {"name": "b", "status": "busy"},
                                                   {"name": "c", "status": "idle"}]}]))

    assert cli.main(["fleet", "list"]) == 0

    assert "3 (2 idle, 1 busy)" in capsys.readouterr().out


# ---- instances, runs, logs, stop -------------------------------------------------------------------


def instance(name: str, index: int | None, group: str | None, fleet: str, **extra) -> dict:
    return {"name": name, "fleet": fleet, "group": group, "group_kind": "tpu_pod" if group else None,
            "index": index, "status": "idle", "backend": "gcp" if group else "ssh", "internal_ip": f"10.1.0.{index}",
            "resources": {"cpus": 96, "memory_gb": 334, "tpu": "v2-32", "tpu_chips": 4} if group else {"cpus": 8},
            "job": None, **extra}


def test_instances_are_grouped_by_pod_in_worker_index_order(api, capsys):
    api.on("GET", "instances/", (200, [
        instance("ssh-host", None, None, "pd"),
        instance("pod-w2", 2, "pod-a", "tpu", job="r1/2"),
        instance("pod-w0", 0, "pod-a", "tpu"),
        instance("pod-w3", 3, "pod-a", "tpu"),
        instance("pod-w1", 1, "pod-a", "tpu"),
    ]))
    api.on("GET", "instance-groups/", (200, [{"name": "pod-a", "kind": "tpu_pod", "shape": "v2-32", "fleet": "tpu"}]))

    assert cli.main(["instances"]) == 0

    out = capsys.readouterr().out
    assert "pod pod-a (tpu_pod, v2-32)" in out
    positions = [out.index(name) for name in ("pod pod-a", "pod-w0", "pod-w1", "pod-w2", "pod-w3", "fleet pd",
                                              "ssh-host")]
    assert positions == sorted(positions)
    assert "r1/2" in out


def test_a_multislice_pod_is_shown_as_slices_times_its_slice_type(api, capsys):
    api.on("GET", "instances/", (200, [instance(f"set-{k}", k, "set-a", "tpu") for k in range(4)]))
    api.on("GET", "instance-groups/", (200, [{"name": "set-a", "kind": "tpu_pod", "shape": "v4-16", "slices": 2,
                                              "fleet": "tpu"}]))

    assert cli.main(["instances"]) == 0

    assert "pod set-a (tpu_pod, 2 x v4-16) in fleet tpu" in capsys.readouterr().out


def test_stop_sends_the_abort_flag(api, capsys):
    api.on("POST", "runs/r1/stop", (200, run("terminating", [])))

    assert cli.main(["stop", "r1", "--abort", "-y"]) == 0
    assert cli.main(["stop", "r1", "-y"]) == 0

    assert [r.body for r in api.calls("POST", "runs/r1/stop")] == [{"abort": True}, {"abort": False}]
    out = capsys.readouterr().out
    assert "run r1: aborting" in out and "run r1: stopping" in out  # not the answer's `terminating`


def test_ps_lists_runs_with_job_summaries(api, capsys):
    api.on("GET", "runs/", (200, [
        run("running", [job(0, "running"), job(1, "provisioning")], name="train-a"),
        run("failed", [job(0, "failed")], name="train-b", termination_reason="job_failed"),
    ]))

    assert cli.main(["ps"]) == 0

    out = capsys.readouterr().out
    assert "train-a" in out and "1 running, 1 provisioning" in out
    assert "train-b" in out and "job_failed" in out


def test_ps_hides_old_finished_runs_unless_all():
    runs = [run("running", [], name="live")] + [run("done", [], name=f"old-{i}") for i in range(15)]

    shown = [r["name"] for r in cli.select_runs(runs, show_all=False)]

    assert shown == ["live"] + [f"old-{i}" for i in range(10)]
    assert len(cli.select_runs(runs, show_all=True)) == 16


def test_logs_follow_prints_until_the_job_finishes(api, capsys):
    log = "epoch 1\nepoch 2\ndone\n"
    api.on("GET", "runs/r1/", (200, run("running", [job(0, "running"), job(2, "running")])))
    api.on("GET", "runs/r1/logs", serve_log(log, statuses=["running", "running", "running", "done"]))

    assert cli.main(["logs", "r1", "--job", "2"]) == 0

    assert capsys.readouterr().out == log
    assert {r.query["job"] for r in api.calls("GET", "runs/r1/logs")} == {"2"}


def test_not_found_detail_is_printed(api, capsys):
    assert cli.main(["logs", "nope"]) == 1
    assert "Not found." in capsys.readouterr().err


def test_unreachable_server_is_reported(home, monkeypatch, capsys):
    monkeypatch.setenv("MUSTER_URL", "http://127.0.0.1:9")  # discard port: nothing listens
    monkeypatch.setenv("MUSTER_TOKEN", "t")

    assert cli.main(["ps"]) == 1

    assert "cannot reach http://127.0.0.1:9" in capsys.readouterr().err


def test_usage_errors_exit_2(home, capsys):
    assert cli.main(["logs"]) == 2
    assert cli.main(["frobnicate"]) == 2


# ---- serve ----------------------------------------------------------------------------------------------


def test_serve_passes_bind_and_concurrency_and_sets_the_settings_module(monkeypatch):
    import muster.serve

    seen = {}

    def fake_serve(bind, concurrency, verbose, dev, gateway_port):
        seen.update(bind=bind, concurrency=concurrency, verbose=verbose, dev=dev, gateway_port=gateway_port,
                    settings=os.environ.get("DJANGO_SETTINGS_MODULE"))
        return 0

    monkeypatch.delenv("DJANGO_SETTINGS_MODULE", raising=False)
    monkeypatch.setattr(muster.serve, "serve", fake_serve)

    assert cli.main(["serve", "--bind", "0.0.0.0:9000", "--concurrency", "3"]) == 0

    assert seen == {"bind": "0.0.0.0:9000", "concurrency": 3, "verbose": False, "dev": False, "gateway_port": None,
                    "settings": "muster.settings"}
    assert cli.main(["serve", "--gateway-port", "2300"]) == 0
    assert seen["gateway_port"] == 2300
