"""dstack's own parser (0.22.5, from .venv-dstack) makes the configuration dump its CLI sends; through
/dstack it must plan and submit as the same YAML does through Muster: groups and their rank space,
GPU names, TPU slices, startup_order, stop_criteria, retry, max_duration, image, env and fleets, with
the client's resource defaults left out and Muster's refusals passed on."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from runs.job_rows import secret_env
from runs.models import Run
from tests.conftest import example
from tests.dstack_cli.bodies import one_detail, post
from tests.dstack_cli.helpers import ROOT, dstack_python

pytestmark = [pytest.mark.dstack_cli, pytest.mark.django_db]

DUMP = ("import json, sys, yaml\n"
        "from dstack._internal.core.models.configurations import parse_run_configuration\n"
        "print(parse_run_configuration(yaml.safe_load(sys.stdin.read())).model_dump_json())\n")


def dstack_dump(text: str) -> dict:
    done = subprocess.run([str(dstack_python()), "-c", DUMP], input=text, capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def run_spec(text: str) -> dict:
    conf = dstack_dump(text)
    return {"run_name": conf.get("name"), "repo_id": "none", "repo_data": {"repo_type": "virtual"},
            "configuration": conf, "profile": {"name": "default"}, "ssh_key_pub": ""}


def jobs_of(plan) -> list[tuple]:
    assert plan.status_code == 200, plan.content
    return [(j["job_spec"]["job_num"], j["job_spec"]["node_group_name"], j["job_spec"]["node_group_job_index"])
            for j in plan.json()["job_plans"]]


def test_three_groups_keep_their_rank_space_order_and_stop_criteria(alice):
    spec = run_spec(example("pd-disagg-local.yml"))
    assert jobs_of(post(alice, "project/main/runs/get_plan", {"run_spec": spec})) == [
        (0, "router", 0), (1, "prefill", 0), (2, "decode", 0)]
    assert post(alice, "project/main/runs/apply", {"plan": {"run_spec": spec}}).status_code == 200
    conf = Run.objects.get(name="pd-local").configuration
    assert (conf["startup_order"], conf["stop_criteria"]) == ("workers-first", "master-done")
    assert "${{ groups[1].nodes[0].IP_ADDRESS }}" in conf["groups"][0]["commands"][0]
    for group in conf["groups"]:  # Muster's defaults, not the client's 2 CPUs / 8 GB / 100 GB
        assert (group["resources"]["cpu"]["min"], group["resources"]["memory"]["min"],
                group["resources"]["disk"]["min"]) == (1, 1.0, 1.0), group["resources"]


def test_a_tpu_slice_is_one_job_per_host(alice):
    plan = post(alice, "project/main/runs/get_plan", {"run_spec": run_spec(example("tpu-v2-32.yml"))})
    assert [j[0] for j in jobs_of(plan)] == [0, 1, 2, 3]
    gpu = plan.json()["job_plans"][0]["job_spec"]["requirements"]["resources"]["gpu"]
    assert gpu["name"] == ["v2-32"], gpu


def test_gpu_names_retry_durations_image_env_and_fleets_carry_over(alice):
    text = yaml.safe_dump({
        "type": "task", "name": "pd", "image": "ubuntu:24.04", "env": {"MODE": "fast"}, "fleets": ["gpus"],
        "retry": {"on_events": ["no-capacity"], "duration": "2h"}, "max_duration": "3h",
        "groups": [{"name": "prefill", "nodes": 1, "commands": ["serve"], "resources": {"gpu": "H100:8"}},
                   {"name": "decode", "nodes": 2, "commands": ["serve"],
                    "resources": {"gpu": "H100:8", "memory": "64GB.."}}]})
    spec = run_spec(text)
    plan = post(alice, "project/main/runs/get_plan", {"run_spec": spec})
    assert jobs_of(plan) == [(0, "prefill", 0), (1, "decode", 0), (2, "decode", 1)]
    assert post(alice, "project/main/runs/apply", {"plan": {"run_spec": spec}}).status_code == 200
    conf = Run.objects.get(name="pd").configuration
    assert conf["retry"] == {"on_events": ["no-capacity"], "duration": 7200} and conf["max_duration"] == 10800
    assert conf["fleets"] == ["gpus"] and conf["image"] == "ubuntu:24.04"
    # the CLI sends env values resolved, secrets among them: all stored encrypted, shown masked
    assert conf["env"] == {"MODE": "***"} and secret_env(Run.objects.get(name="pd")) == {"MODE": "fast"}
    assert "fast" not in json.dumps(conf)
    prefill, decode = conf["groups"]
    assert prefill["resources"]["gpu"]["names"] == ["H100"] and prefill["resources"]["gpu"]["count"] == {
        "min": 8, "max": 8}
    assert decode["resources"]["memory"]["min"] == 64.0 and prefill["resources"]["memory"]["min"] == 1.0


def test_a_key_muster_refuses_is_the_same_400_as_in_a_yaml(alice):
    # (a backend Muster lacks is no longer one: accepted with a warning, as dstack accepts it)
    text = "type: task\ncommands: [echo]\nvolumes: [\"my-vol:/data\"]\n"
    msg = one_detail(post(alice, "project/main/runs/get_plan", {"run_spec": run_spec(text)}), 400, "error")
    assert msg.startswith("volumes") and "Muster has no network volumes" in msg, msg
    assert not Run.objects.exists()
