"""tests/api/test_idempotency.py through /dstack's runs/apply: the same Idempotency-Key rules, and
the retry dstack's own client makes (it sends a request again when the connection broke, with the
same plan and no key) gets the run the first apply made instead of an error."""

from __future__ import annotations

import copy

import pytest

from runs.models import Run
from tests.dstack_cli.bodies import RUN_SPEC, TASK, dstack_client, one_detail, post

pytestmark = pytest.mark.django_db

APPLY = "/dstack/api/project/main/runs/apply"
UNNAMED = {**copy.deepcopy(RUN_SPEC), "run_name": None,
           "configuration": {**copy.deepcopy(TASK), "name": None, "nodes": 1, "commands": ["echo once"]}}
NAMED = {**copy.deepcopy(UNNAMED), "run_name": "hello", "configuration": {**UNNAMED["configuration"], "name": "hello"}}


def submit(client, key=None, run_spec=UNNAMED, current=None):
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key is not None else {}
    return client.post(APPLY, {"plan": {"run_spec": run_spec, "current_resource": current}}, format="json", **headers)


def other_commands(spec: dict) -> dict:
    return {**spec, "configuration": {**spec["configuration"], "commands": ["echo something else"]}}


def test_the_same_key_twice_gives_the_same_run_once(alice):
    first = submit(alice, "3f1c2b7e-retry-me")
    assert first.status_code == 200, first.content
    again = submit(alice, "3f1c2b7e-retry-me")
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    assert again.headers["Idempotent-Replayed"] == "true" and "Idempotent-Replayed" not in first.headers
    assert Run.objects.count() == 1


def test_without_a_key_each_unnamed_apply_is_a_new_run(alice):
    assert submit(alice).status_code == 200 and submit(alice).status_code == 200
    assert Run.objects.count() == 2


def test_the_same_key_with_another_body_is_a_400_on_the_header(alice):
    assert submit(alice, "k1").status_code == 200
    msg = one_detail(submit(alice, "k1", other_commands(UNNAMED)), 400, "error")
    assert msg.startswith("headers.Idempotency-Key:"), msg
    assert Run.objects.count() == 1


def test_keys_belong_to_their_caller(alice, make_user):
    bob = dstack_client(make_user("bob", role="user"))
    a, b = submit(alice, "shared-key"), submit(bob, "shared-key")
    assert a.status_code == b.status_code == 200
    assert a.json()["id"] != b.json()["id"]


@pytest.mark.parametrize("key", ["", "x" * 256, "has space", "ключ"])
def test_a_malformed_key_is_a_400_on_the_header(alice, key):
    assert one_detail(submit(alice, key), 400, "error").startswith("headers.Idempotency-Key:")
    assert not Run.objects.exists()


def test_a_key_is_free_again_once_its_run_is_deleted(alice):
    name = submit(alice, "k2").json()["run_spec"]["run_name"]
    Run.objects.filter(name=name).update(status="done")
    assert post(alice, "project/main/runs/delete", {"runs_names": [name]}).status_code == 200
    again = submit(alice, "k2")
    assert again.status_code == 200 and "Idempotent-Replayed" not in again.headers


def test_an_apply_retried_after_a_lost_answer_gets_the_run_the_first_one_made(alice):
    first = submit(alice, run_spec=NAMED)
    assert first.status_code == 200, first.content
    retried = submit(alice, run_spec=NAMED)  # the same plan: nothing was there when it was made
    assert retried.status_code == 200, retried.content
    assert retried.json()["id"] == first.json()["id"] and retried.headers["Idempotent-Replayed"] == "true"
    assert Run.objects.count() == 1


def test_an_apply_of_another_configuration_over_the_run_is_refused_in_dstacks_words(alice):
    assert submit(alice, run_spec=NAMED).status_code == 200
    msg = one_detail(submit(alice, run_spec=other_commands(NAMED)), 400, "error")
    assert msg.startswith("Failed to apply plan. Resource has been changed"), msg
    assert Run.objects.count() == 1


def test_another_member_applying_the_same_name_does_not_get_the_run(alice, make_user):
    first = submit(alice, run_spec=NAMED).json()
    bob = dstack_client(make_user("bob", role="user"))
    assert "still submitted" in one_detail(submit(bob, run_spec=NAMED), 400, "error")
    assert Run.objects.get().user.username == "alice" and Run.objects.get().stop_requested == ""
    assert post(alice, "project/main/runs/get", {"run_name": "hello"}).json()["id"] == first["id"]


def test_a_new_plan_over_the_finished_run_makes_a_new_run(alice):
    first = submit(alice, run_spec=NAMED).json()
    Run.objects.filter(name="hello").update(status="done")
    current = post(alice, "project/main/runs/get", {"run_name": "hello"}).json()
    second = submit(alice, run_spec=NAMED, current=current)  # what dstack sends once the plan saw the old run
    assert second.status_code == 200 and "Idempotent-Replayed" not in second.headers
    assert second.json()["id"] != first["id"] and second.json()["status"] == "submitted"
    assert Run.objects.count() == 1
    assert submit(alice, run_spec=NAMED, current=current).json()["id"] == second.json()["id"]  # its retry
