"""tests/api/test_access_matrix.py through /dstack: every dstack call, for strangers, readers, the
lowest role that writes and anonymous callers, on the same world. dstack's words for the native
codes: a project you are not in is 400 `resource_not_exists` (the native 404), no or a bad token is
403 "Invalid token" (the native 401), a read-only member's change is 403."""

from __future__ import annotations

import copy

import pytest
from rest_framework.test import APIClient

from instances.models import Fleet, Instance, InstanceStatus
from runs.models import Job, Run
from tests.api.test_access_matrix import SECRET_VALUE, tables_holding
from tests.dstack_cli.bodies import FLEET_SPEC, PRIVATE, RUN_SPEC, TASK, dstack_client, post

pytestmark = pytest.mark.django_db

P = "project/alpha"
RUN = {**copy.deepcopy(RUN_SPEC), "run_name": "r2", "configuration": {**copy.deepcopy(TASK), "name": "r2", "nodes": 1}}
READS = [
    ("projects/alpha/get", None), (f"{P}/runs/get", {"run_name": "r1"}), (f"{P}/fleets/list", {}),
    (f"{P}/fleets/get", {"name": "f1"}), (f"{P}/logs/poll", {"run_name": "r1", "job_submission_id": "JOB"}),
]
WRITES = [
    (f"{P}/repos/init", {"repo_id": "none", "repo_info": {"repo_type": "virtual"}}),
    (f"{P}/runs/get_plan", {"run_spec": RUN}),
    (f"{P}/runs/apply", {"plan": {"run_spec": RUN}}),
    (f"{P}/runs/stop", {"runs_names": ["r1"], "abort": False}),
    (f"{P}/runs/delete", {"runs_names": ["r1"]}),
    (f"{P}/fleets/get_plan", {"spec": FLEET_SPEC}),
    (f"{P}/fleets/apply", {"plan": {"spec": FLEET_SPEC}}),
    (f"{P}/fleets/delete", {"names": ["f1"]}),
    (f"{P}/fleets/delete_instances", {"name": "f1", "instance_nums": [0]}),
]


def _body(body):
    if body and body.get("job_submission_id") == "JOB":
        return {**body, "job_submission_id": str(Job.objects.get(run__name="r1").uuid)}
    return body


def anonymous(token: str | None) -> APIClient:
    client = APIClient()
    if token is not None:
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}", HTTP_X_API_VERSION="0.22.5")
    return client


def assert_invalid_token(answer):
    assert answer.status_code == 403 and answer.json() == {"detail": {"msg": "Invalid token", "code": None}}, \
        answer.content


def code_of(answer) -> str | None:
    return answer.json()["detail"][0]["code"] if answer.status_code >= 400 else None


def untouched():
    assert Run.objects.get(name="r1").stop_requested == "" and not Run.objects.filter(name="r2").exists()
    assert Fleet.objects.filter(name="f1").exists() and not Fleet.objects.filter(name="ssh2").exists()
    assert Instance.objects.get(name="g1-0").status == InstanceStatus.IDLE


@pytest.mark.parametrize("path,body", READS)
def test_reads_are_not_found_for_strangers_refused_without_a_token_and_answered_for_members(world, path, body):
    answer = post(dstack_client(world["stranger"]), path, _body(body))
    assert answer.status_code == 400 and code_of(answer) == "resource_not_exists", answer.content
    assert_invalid_token(post(anonymous(None), path, _body(body)))
    assert_invalid_token(post(anonymous("mst_not-a-token"), path, _body(body)))
    for role in ("admin", "user", "read-only"):
        assert post(dstack_client(world[role]), path, _body(body)).status_code == 200, (role, path)


@pytest.mark.parametrize("path,body", WRITES)
def test_writes_are_not_found_for_strangers_refused_without_a_token_and_403_for_readers(world, path, body):
    answer = post(dstack_client(world["stranger"]), path, body)
    assert answer.status_code == 400 and code_of(answer) == "resource_not_exists", answer.content
    assert_invalid_token(post(anonymous(None), path, body))
    answer = post(dstack_client(world["read-only"]), path, body)
    assert answer.status_code == 403 and code_of(answer) == "error", answer.content
    untouched()


@pytest.mark.parametrize("path,body", WRITES)
def test_the_user_role_gets_past_the_access_check_on_every_write(world, path, body):
    """The lowest role that writes: whatever the call then answers, it is not a refusal of access."""
    answer = post(dstack_client(world["user"]), path, body)
    assert answer.status_code != 403 and code_of(answer) != "resource_not_exists", answer.content


def test_the_run_list_shows_only_the_callers_projects(world):
    assert post(dstack_client(world["stranger"]), "runs/list", {"project_name": "alpha"}).json() == []
    assert post(dstack_client(world["stranger"]), "runs/list", {}).json() == []
    assert [r["run_spec"]["run_name"] for r in post(dstack_client(world["read-only"]), "runs/list", {}).json()] \
        == ["r1"]
    assert_invalid_token(post(anonymous(None), "runs/list", {}))


def test_the_database_never_holds_a_key_or_an_env_value_sent_through_dstack_in_plaintext(world):
    alice = dstack_client(world["admin"])
    mine = post(alice, "users/get_my_user").json()["ssh_private_key"]
    secret_run = {**RUN, "configuration": {**RUN["configuration"], "env": {"HF_TOKEN": SECRET_VALUE}}}
    assert post(alice, f"{P}/runs/apply", {"plan": {"run_spec": secret_run}}).status_code == 200
    plan = post(alice, f"{P}/fleets/get_plan", {"spec": FLEET_SPEC}).json()
    post(alice, f"{P}/fleets/apply", {"plan": {"spec": plan["spec"]}})  # registered by a task: kept pending
    assert Fleet.objects.filter(name="ssh2").exists()
    assert tables_holding(SECRET_VALUE, "plaintext", PRIVATE.splitlines()[1], mine.splitlines()[2]) == []
