"""The /dstack layer through HTTP as dstack's client sends it (POST + JSON, `Authorization: Bearer`):
dstack's error format for every refusal (one `detail` entry, never a 500), the same roles and
tenancy as the native API, the client's resource defaults not turned into requirements, and keys
that never come back in clear. The bodies are those dstack 0.22.5 sends (reference §6)."""

from __future__ import annotations

import copy
import json

import pytest
from rest_framework.test import APIClient

from dstack_api.models import UserSSHKey
from instances.models import Fleet
from projects.models import Project
from runs.models import Run
from tests.dstack_cli.bodies import FLEET_SPEC, RUN_SPEC, dstack_client, one_detail, post, small_fleet

pytestmark = pytest.mark.django_db

def test_a_bad_token_is_answered_as_dstack_answers_it(db):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer mst_nonsense")
    answer = post(client, "projects/main/get")
    assert answer.status_code == 403
    assert answer.json() == {"detail": {"msg": "Invalid token", "code": None}}
    assert post(APIClient(), "users/get_my_user").status_code == 403


def test_a_newer_client_is_refused_with_dstacks_message(alice):
    alice.credentials(HTTP_AUTHORIZATION=alice._credentials["HTTP_AUTHORIZATION"], HTTP_X_API_VERSION="0.23.0")
    msg = one_detail(post(alice, "projects/main/get"), 400, "error")
    assert msg == "The client/CLI version (0.23.0) is incompatible with the server version (0.22.5)."
    alice.credentials(HTTP_AUTHORIZATION=alice._credentials["HTTP_AUTHORIZATION"], HTTP_X_API_VERSION="0.22.9")
    assert post(alice, "projects/main/get").status_code == 200


def test_the_project_is_the_muster_project_with_its_members_roles(alice, make_user):
    make_user("reader", role="read-only")
    answer = post(alice, "projects/main/get").json()
    roles = {m["user"]["username"]: (m["project_role"], m["permissions"]["can_manage_ssh_fleets"])
             for m in answer["members"]}
    assert answer["project_name"] == "main" and roles == {"alice": ("admin", True), "reader": ("user", False)}


def test_each_user_gets_one_own_keypair_stored_encrypted(alice, make_user):
    first, again = post(alice, "users/get_my_user").json(), post(alice, "users/get_my_user").json()
    assert first["ssh_public_key"].startswith("ssh-ed25519 ") and first["ssh_private_key"].startswith("-----BEGIN")
    assert (first["ssh_public_key"], first["ssh_private_key"]) == (again["ssh_public_key"], again["ssh_private_key"])
    stored = UserSSHKey.objects.get(user__username="alice")
    assert "PRIVATE KEY" not in stored.private_key_encrypted
    bob = post(dstack_client(make_user("bob")), "users/get_my_user").json()
    assert bob["ssh_public_key"] != first["ssh_public_key"]


def test_the_clients_resource_defaults_do_not_become_requirements(alice):
    small_fleet()  # 1 CPU, 2 GB, 20 GB disk: under the client's cpu 2.., memory 8GB.., disk 100GB..
    plan = post(alice, "project/main/runs/get_plan", {"run_spec": RUN_SPEC, "max_offers": 3})
    assert plan.status_code == 200, plan.content
    jobs = plan.json()["job_plans"]
    assert [j["job_spec"]["job_num"] for j in jobs] == [0, 1]
    assert all(j["total_offers"] == 2 for j in jobs), plan.json()
    cpu = jobs[0]["job_spec"]["requirements"]["resources"]["cpu"]["count"]
    assert cpu["min"] == 1, cpu
    written = copy.deepcopy(RUN_SPEC)
    written["configuration"]["resources"]["cpu"] = {"arch": None, "count": {"min": 4, "max": None}}
    plan = post(alice, "project/main/runs/get_plan", {"run_spec": written}).json()
    assert all(j["total_offers"] == 0 for j in plan["job_plans"]), plan["job_plans"]  # a written value stays


@pytest.mark.parametrize("path, body", [
    ("project/main/runs/stop", {"runs_names": "hello"}),
    ("project/main/runs/get", {"run_name": ["hello"]}),
    ("project/main/logs/poll", {"run_name": "hello", "job_submission_id": "not-a-uuid"}),
    ("project/main/runs/get_plan", {"run_spec": "task"}),
    ("project/main/runs/apply", {"plan": {"run_spec": {"configuration": {"type": "task", "nodes": "many"}}}}),
    ("project/main/fleets/get_plan", {"spec": {"configuration": {"type": "fleet", "ssh_config": 7}}}),
    ("project/main/fleets/delete", {"names": [{}]}),
    ("runs/list", {"limit": "all"}),
    ("runs/list", [1, 2]),
])
def test_wrong_types_are_one_dstack_error_not_a_500(alice, path, body):
    msg = one_detail(post(alice, path, body), 400, "error")
    assert msg
    assert not Run.objects.exists() and not Fleet.objects.exists()


def test_malformed_json_is_one_dstack_error(alice):
    answer = alice.post("/dstack/api/project/main/runs/get", data='{"run_name": ', content_type="application/json")
    assert "JSON" in one_detail(answer, 400, "error")


def test_a_read_only_member_cannot_apply_but_can_read(make_user):
    make_user("alice")
    reader = dstack_client(make_user("reader", role="read-only"))
    assert one_detail(post(reader, "project/main/runs/apply", {"plan": {"run_spec": RUN_SPEC}}), 403, "error")
    assert one_detail(post(reader, "project/main/repos/init", {"repo_id": "none",
                                                               "repo_info": {"repo_type": "virtual"}}), 403, "error")
    assert one_detail(post(reader, "project/main/fleets/apply", {"plan": {"spec": FLEET_SPEC}}), 403, "error")
    assert one_detail(post(reader, "project/main/runs/get_plan", {"run_spec": RUN_SPEC}), 403, "error")
    Run.objects.create(project=Project.objects.get(name="main"), name="theirs", configuration={}, status="running")
    small_fleet()
    for path, body in (("runs/stop", {"runs_names": ["theirs"]}), ("runs/delete", {"runs_names": ["theirs"]}),
                       ("fleets/delete", {"names": ["small"]})):
        assert one_detail(post(reader, f"project/main/{path}", body), 403, "error")
    assert Run.objects.get(name="theirs").stop_requested == "" and Fleet.objects.filter(name="small").exists()
    assert post(reader, "project/main/runs/get", {"run_name": "theirs"}).json()["status"] == "running"
    Run.objects.all().delete()
    Fleet.objects.all().delete()
    assert not Run.objects.exists() and not Fleet.objects.exists()
    assert post(reader, "project/main/fleets/list", {"include_imported": True}).json() == []
    assert post(reader, "runs/list", {"project_name": "main"}).json() == []


def test_another_tenants_project_and_runs_are_not_found(alice, make_user):
    Run.objects.create(project=Project.objects.get(name="main"), name="secret-run", configuration={})
    mallory = dstack_client(make_user("mallory", project="other"))
    assert one_detail(post(mallory, "projects/main/get"), 400, "resource_not_exists")
    assert one_detail(post(mallory, "project/main/runs/get", {"run_name": "secret-run"}), 400, "resource_not_exists")
    assert one_detail(post(mallory, "project/other/runs/get", {"run_name": "secret-run"}), 400,
                      "resource_not_exists") == "Run not found"
    assert post(mallory, "runs/list", {}).json() == []
    assert one_detail(post(mallory, "project/main/runs/stop", {"runs_names": ["secret-run"]}), 400,
                      "resource_not_exists")
    assert Run.objects.get(name="secret-run").stop_requested == ""


def test_an_active_run_is_not_deleted(alice):
    Run.objects.create(project=Project.objects.get(name="main"), name="busy", configuration={}, status="running")
    assert one_detail(post(alice, "project/main/runs/delete", {"runs_names": ["busy"]}), 400,
                      "error") == "Cannot delete active runs: ['busy']"


def test_a_repository_is_refused_clearly(alice):
    answer = post(alice, "project/main/repos/init", {"repo_id": "r", "repo_info": {"repo_type": "remote"}})
    assert "repos:" in one_detail(answer, 400, "error")
    virtual = post(alice, "project/main/repos/init", {"repo_id": "none", "repo_info": {"repo_type": "virtual"}})
    assert virtual.status_code == 200 and virtual.json() is None


def test_the_fleet_plan_never_answers_the_private_key_in_clear(alice, make_user):
    plan = post(alice, "project/main/fleets/get_plan", {"spec": FLEET_SPEC})
    assert plan.status_code == 200, plan.content
    assert "PRIVATE KEY" not in plan.content.decode()
    assert plan.json()["effective_spec"]["configuration"]["ssh_config"]["ssh_key"]["private"] is None
    sealed = plan.json()["spec"]
    # another member re-sending alice's sealed key gets nothing from it
    bob = dstack_client(make_user("bob"))
    msg = one_detail(post(bob, "project/main/fleets/apply", {"plan": {"spec": sealed}}), 400, "error")
    assert "not yours" in msg and not Fleet.objects.exists()
    assert json.dumps(sealed).count("muster-sealed:") == 1


PATHS = ["projects/main/get", "users/get_my_user", "runs/list", "project/main/repos/init",
         "project/main/runs/get_plan", "project/main/runs/apply", "project/main/runs/get", "project/main/runs/stop",
         "project/main/runs/delete", "project/main/logs/poll", "project/main/fleets/list", "project/main/fleets/get",
         "project/main/fleets/get_plan", "project/main/fleets/apply", "project/main/fleets/delete",
         "project/main/fleets/delete_instances"]
HOSTILE = ["null", "[]", '"text"', "12", '{"run_spec": null}', '{"plan": []}', '{"plan": {"run_spec": []}}',
           '{"plan": {"spec": {"configuration": []}}}', '{"spec": {"configuration": {"type": "fleet"}}}',
           '{"run_spec": {"configuration": {"type": "task", "nodes": 99999999999999999999}}}',
           '{"run_spec": {"configuration": {"type": "service"}}}', '{"run_name": "x", "next_token": "-5"}',
           '{"names": ["' + "n" * 5000 + '"]}', "[" * 5000 + "]" * 5000, '{"limit": 1e400}', "\xff\xfe"]


@pytest.mark.parametrize("path", PATHS)
def test_hostile_bodies_on_every_call_are_a_4xx_in_dstacks_format_never_a_500(alice, path):
    for body in HOSTILE:
        answer = alice.post(f"/dstack/api/{path}", data=body, content_type="application/json")
        assert answer.status_code < 500, (path, body[:80], answer.status_code, answer.content[:300])
        if answer.status_code >= 400:
            one_detail(answer, answer.status_code, answer.json()["detail"][0]["code"])
    assert not Run.objects.exists() and not Fleet.objects.exists()
