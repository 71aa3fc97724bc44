"""`slices: N` at plan time, through the API and the real CLI against a live server: the layout
(nodes = slices x hosts, the plan's slices x hosts) and each unsupported TPU type a 400 naming
`slices` and the fix, with nothing created."""

from __future__ import annotations

import pytest
import yaml

from runs.models import Run
from tests.cli.test_cli_live import muster, write  # noqa: F401 - fixtures
from tests.conftest import example

pytestmark = [pytest.mark.django_db(transaction=True)]


def _plan(api, conf: dict):
    return api.post("/api/projects/main/runs/plan", {"configuration": conf}, format="json")


def _task(gpu: str, **changes) -> dict:
    return {"type": "task", "name": "ms", "commands": ["echo hi"], "resources": {"gpu": gpu}, **changes}


def _fields(response) -> dict[str, str]:
    body = response.json()
    return {".".join(str(p) for p in e["loc"]): e["msg"] for e in body["errors"]}


def test_two_v4_16_slices_plan_four_nodes_in_one_rank_space(api):
    response = _plan(api, _task("tpu-v4-16", slices=2))

    assert response.status_code == 200, response.content
    body = response.json()
    [group] = body["configuration"]["groups"]
    assert (group["nodes"], group["slices"]) == (4, 2)
    assert [(j["job_num"], j["node_group_rank"]) for j in body["jobs"]] == [(0, 0), (1, 1), (2, 2), (3, 3)]


@pytest.mark.parametrize(("gpu", "changes", "field", "says"), [
    ("tpu-v2-32", {}, "slices", "multislice needs TPU v4 or newer"),
    ("tpu-v3-32", {}, "slices", "use e.g. tpu-v4-32 or remove slices"),
    ("tpu-v4-8", {}, "slices", "v4-8 is one host: use a larger slice (v4-16 or larger)"),
    ("tpu-v5litepod-8", {}, "slices", "multislice needs multi-host slices"),
    ("H100", {}, "slices", "slices needs a TPU `gpu:` of v4 or newer"),
    ("tpu-v4-16", {"nodes": 2}, "nodes", "2 x v4-16 slices have 4 hosts: set nodes: 4"),
    ("tpu-v4-16", {"slices": 0}, "slices", "slices must be from 1 to 256"),
    ("tpu-v4-16", {"slices": 1, "on_slice_failure": "replace-slice"}, "on_slice_failure",
     "replace-slice replaces one slice of a multislice set: set slices: 2 or more"),
    ("tpu-v4-16", {"on_slice_failure": "replace"}, "on_slice_failure", "'whole-set' or 'replace-slice'"),
])
def test_a_slice_set_that_cannot_be_had_is_a_400_naming_the_field_and_the_fix(api, gpu, changes, field, says):
    response = _plan(api, _task(gpu, **{"slices": 2, **changes}))

    assert response.status_code == 400, response.content
    errors = _fields(response)
    assert says in errors.get(field, ""), errors


def test_slices_on_a_groups_task_is_per_group_and_a_submit_with_a_bad_one_creates_nothing(api):
    grouped = {"type": "task", "name": "ms", "slices": 2, "groups": [
        {"name": "train", "resources": {"gpu": "tpu-v4-16"}, "commands": ["echo"]}]}
    assert "slices" in _fields(_plan(api, grouped))

    bad = {"type": "task", "name": "ms", "groups": [
        {"name": "router", "commands": ["echo"]},
        {"name": "train", "slices": 2, "resources": {"gpu": "tpu-v3-64"}, "commands": ["echo"]}]}
    response = api.post("/api/projects/main/runs/", {"configuration": bad}, format="json")

    assert response.status_code == 400
    assert "multislice needs TPU v4 or newer" in _fields(response)["groups.1.slices"]
    assert not Run.objects.exists()


@pytest.mark.slow
def test_the_cli_plan_shows_slices_times_hosts(muster, tmp_path):  # noqa: F811
    result = muster("plan", "-f", write(tmp_path, "type: task\nname: ms\nslices: 2\nresources: {gpu: tpu-v4-32}\n"
                                                  "commands: [echo]\n"))

    assert "8 (2 slices x 4 hosts)" in result.stdout, (result.stdout, result.stderr)


def test_on_slice_failure_is_stored_with_the_group_and_defaults_to_whole_set(api):
    replace = _plan(api, _task("tpu-v4-16", slices=3, on_slice_failure="replace-slice")).json()
    default = _plan(api, _task("tpu-v4-16", slices=3)).json()

    assert replace["configuration"]["groups"][0]["on_slice_failure"] == "replace-slice"
    assert default["configuration"]["groups"][0]["on_slice_failure"] == "whole-set"
    example_plan = _plan(api, yaml.safe_load(example("tpu-multislice-replace.yml")))
    assert example_plan.status_code == 200, example_plan.content
    [group] = example_plan.json()["configuration"]["groups"]
    assert (group["nodes"], group["slices"], group["on_slice_failure"]) == (6, 3, "replace-slice")


def test_the_queued_spot_multislice_example_plans_two_v5p_16_slices_as_four_nodes(api):
    conf = yaml.safe_load(example("tpu-queued-spot-multislice.yml"))

    response = _plan(api, conf)

    assert response.status_code == 200, response.content
    [group] = response.json()["configuration"]["groups"]
    assert (group["nodes"], group["slices"], group["resources"]["gpu"]["tpu"]) == (4, 2, "v5p-16")
