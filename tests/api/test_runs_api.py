from __future__ import annotations

import pytest

from runs.models import Job, Run
from tests.conftest import client_for, example

pytestmark = pytest.mark.django_db


def plan(api, configuration, env=None, project="main"):
    body = {"configuration": configuration, "env": env or {}}
    return api.post(f"/api/projects/{project}/runs/plan", body, format="json")


def test_the_seed_pd_config_plans_to_three_ranked_jobs_with_references_kept(api):
    resp = plan(api, example("pd-disagg.yml"), env={"HF_TOKEN": "hf_secret"})
    assert resp.status_code == 200, resp.json()
    jobs = resp.json()["jobs"]
    assert [j["job_num"] for j in jobs] == [0, 1, 2]
    assert [j["node_group_name"] for j in jobs] == ["router", "prefill", "decode"]
    assert [j["node_group_rank"] for j in jobs] == [0, 0, 0]
    # what a job runs is its group's, stated once per group
    groups = [resp.json()["configuration"]["groups"][j["node_group_index"]] for j in jobs]
    router_commands = "\n".join(groups[0]["commands"])
    assert "${{ groups[1].nodes[0].IP_ADDRESS }}" in router_commands
    assert "${{ groups[2].nodes[0].IP_ADDRESS }}" in router_commands
    assert groups[1]["resources"]["gpu"]["names"] == ["L40S"]
    assert groups[0]["env"]["HF_TOKEN"] == "***", "values of bare env keys are not echoed back"


def test_a_bad_reference_is_a_400_with_its_exact_location(api):
    conf = {"type": "task", "groups": [
        {"name": "a", "nodes": 1, "commands": ["echo ok", "echo ${{ groups[5].nodes[0].IP_ADDRESS }}"]}]}
    resp = plan(api, conf)
    assert resp.status_code == 400
    errors = resp.json()["errors"]
    assert errors[0]["loc"] == ["groups", 0, "commands", 1]
    assert errors[0]["msg"]


def test_broken_yaml_is_a_400_naming_line_and_column(api):
    resp = plan(api, "type: task\ncommands: [echo\n  nodes: 2\n")
    assert resp.status_code == 400
    assert "line" in resp.json()["errors"][0]["msg"]


def test_a_missing_env_value_names_the_variable(api):
    resp = plan(api, "type: task\nenv: [HF_TOKEN]\ncommands: [echo]\n")
    assert resp.status_code == 400
    assert "HF_TOKEN" in resp.json()["errors"][0]["msg"]


def test_a_project_secret_fills_a_bare_env_key_and_is_not_stored_in_plaintext(api, project):
    from projects.models import Secret

    secret = Secret(project=project, name="HF_TOKEN")
    secret.value = "hf_very_secret"
    secret.save()
    resp = api.post("/api/projects/main/runs/", {"configuration": example("pd-disagg.yml")}, format="json")
    assert resp.status_code == 201, resp.json()
    run = Run.objects.get(name="pd-disagg")
    assert "hf_very_secret" not in str(run.configuration)
    assert all("hf_very_secret" not in str(job.spec) for job in run.jobs.all())
    from runs.job_rows import secret_env

    assert secret_env(run) == {"HF_TOKEN": "hf_very_secret"}


def test_submitting_creates_the_run_and_only_job_0_is_claimable(api, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks() as callbacks:
        resp = api.post("/api/projects/main/runs/", {"configuration": example("pd-disagg.yml"),
                                                     "env": {"HF_TOKEN": "x"}}, format="json")
    assert resp.status_code == 201, resp.json()
    body = resp.json()
    assert body["status"] == "submitted"
    jobs = Job.objects.filter(run__name="pd-disagg").order_by("job_num")
    assert [j.waiting_master_job for j in jobs] == [False, True, True]
    assert all(j.status == "submitted" for j in jobs)
    assert len(callbacks) == 1, "exactly one task (job 0's provisioning) is enqueued, after commit"


def test_an_invalid_run_creates_nothing(api):
    resp = api.post("/api/projects/main/runs/", {"configuration": {"type": "task", "nodes": 0}}, format="json")
    assert resp.status_code == 400
    assert Run.objects.count() == 0 and Job.objects.count() == 0


def test_a_name_in_use_by_an_active_run_is_refused(api):
    body = {"configuration": "type: task\nname: same\ncommands: [sleep 1]\n"}
    assert api.post("/api/projects/main/runs/", body, format="json").status_code == 201
    resp = api.post("/api/projects/main/runs/", body, format="json")
    assert resp.status_code == 400
    assert resp.json()["errors"][0]["loc"] == ["name"]


def test_the_submit_answer_is_what_the_run_detail_shows(api):
    created = api.post("/api/projects/main/runs/", {"configuration": "type: task\nnodes: 3\ncommands: [echo]\n"},
                       format="json")
    assert created.status_code == 201
    body = created.json()
    detail = api.get(f"/api/projects/main/runs/{body['name']}/").json()
    assert body == detail
    assert [j["job_num"] for j in body["jobs"]] == [0, 1, 2]


def test_a_generated_run_name_that_clashes_is_drawn_again(api, monkeypatch):
    from runs.services import submission

    drawn = iter(["run-aaaaaa", "run-aaaaaa", "run-aaaaaa", "run-bbbbbb"])
    monkeypatch.setattr(submission, "_generated_name", lambda: next(drawn))
    body = {"configuration": "type: task\ncommands: [echo]\n"}
    first = api.post("/api/projects/main/runs/", body, format="json")
    second = api.post("/api/projects/main/runs/", body, format="json")
    assert (first.status_code, second.status_code) == (201, 201)
    assert [first.json()["name"], second.json()["name"]] == ["run-aaaaaa", "run-bbbbbb"]
    assert Run.objects.count() == 2 and Job.objects.count() == 2


def test_runs_list_filters_by_status_and_detail_has_jobs(api):
    api.post("/api/projects/main/runs/", {"configuration": "type: task\nname: r1\nnodes: 2\ncommands: [echo ok]\n"},
             format="json")
    assert [r["name"] for r in api.get("/api/projects/main/runs/?status=submitted").json()] == ["r1"]
    assert api.get("/api/projects/main/runs/?status=done").json() == []
    detail = api.get("/api/projects/main/runs/r1/").json()
    assert [j["job_num"] for j in detail["jobs"]] == [0, 1]
    assert "secret_env" not in detail["configuration"]


def test_a_stranger_gets_404_a_reader_403_and_nobody_401(api, make_user):
    api.post("/api/projects/main/runs/", {"configuration": "type: task\nname: r1\ncommands: [echo ok]\n"}, format="json")
    stranger = client_for(make_user("mallory", project="other"))
    assert stranger.get("/api/projects/main/runs/r1/").status_code == 404
    assert stranger.get("/api/projects/main/runs/").status_code == 404
    reader = client_for(make_user("rita", role="read-only"))
    assert reader.get("/api/projects/main/runs/r1/").status_code == 200
    assert reader.post("/api/projects/main/runs/r1/stop", {}, format="json").status_code == 403
    assert client_for(None).get("/api/projects/main/runs/").status_code == 401


def test_deleting_an_unfinished_run_is_refused(api):
    api.post("/api/projects/main/runs/", {"configuration": "type: task\nname: r1\ncommands: [echo ok]\n"}, format="json")
    resp = api.delete("/api/projects/main/runs/r1/")
    assert resp.status_code == 400
    assert "stop it" in resp.json()["errors"][0]["msg"]


@pytest.mark.parametrize("body, content_type", [
    ('{"configuration": "type: task"', "application/json"),
    ("not json at all", "application/json"),
    ("<xml/>", "application/xml"),
])
def test_a_body_that_cannot_be_read_is_a_400_with_located_errors(api, body, content_type):
    resp = api.generic("POST", "/api/projects/main/runs/plan", body, content_type=content_type)
    assert resp.status_code in (400, 415), resp.content
    errors = resp.json()["errors"]
    assert errors and all(set(e) == {"loc", "msg"} and e["msg"] for e in errors)
    assert errors[0]["loc"] == []


def test_an_earlier_attempts_log_is_read_by_its_submission_and_a_wrong_one_is_a_located_400(api, settings, tmp_path):
    settings.MUSTER = {**settings.MUSTER, "LOG_DIR": str(tmp_path)}
    assert api.post("/api/projects/main/runs/", {"configuration": "type: task\nname: again\ncommands: [echo]\n"},
                    format="json").status_code == 201
    run = Run.objects.get(name="again")
    old = run.jobs.get()
    Job.objects.filter(pk=old.pk).update(superseded=True)
    Job.objects.create(run=run, job_num=0, submission_num=1, node_group_name="default", spec=old.spec)
    from runs.log_storage import stored_path

    path = stored_path(old)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"the first attempt\n")

    earlier = api.get("/api/projects/main/runs/again/logs?job=0&submission=0").json()
    assert (earlier["submission"], earlier["text"]) == (0, "the first attempt\n")
    assert api.get("/api/projects/main/runs/again/logs?job=0").json()["text"] == ""  # the current attempt's
    detail = api.get("/api/projects/main/runs/again/").json()
    assert [(j["job_num"], j["submission_num"]) for j in detail["earlier_jobs"]] == [(0, 0)]
    missing = api.get("/api/projects/main/runs/again/logs?job=0&submission=7")
    assert missing.status_code == 400 and "in submission 7" in str(missing.json())
    bad = api.get("/api/projects/main/runs/again/logs?job=0&submission=-1")
    assert bad.status_code == 400 and "submission" in str(bad.json())
