"""dstack's dialect through the plan API: every key accepted or refused with a reason, warnings for
what does not take effect, dstack's group names, and every problem of a document in one 400."""

from __future__ import annotations

import pytest

from instances.models import Instance

pytestmark = pytest.mark.django_db


def plan(api, configuration, **extra):
    return api.post("/api/projects/main/runs/plan", {"configuration": configuration, **extra}, format="json")


def fields(resp) -> dict[str, str]:
    return {w["field"]: w["message"] for w in resp.json()["warnings"]}


def locs(resp) -> list[list]:
    assert resp.status_code == 400, resp.json()
    return [e["loc"] for e in resp.json()["errors"]]


# ---- 4. all errors at once -----------------------------------------------------------------------


def test_every_problem_of_a_document_comes_in_one_400_each_with_its_location(api):
    conf = """
type: task
nodez: 2
max_duration: 99999999999999999999d
env: [HF_TOKEN]
groups:
  - nodes: 1
    commandz: [x]
  - name: worker
    resources:
      gpu: H1000:8
      cpu: lots
  - name: worker
    commands: ["echo ${{ groups[9].nodes[0].IP_ADDRESS }}"]
"""
    found = locs(plan(api, conf))
    for loc in (
        ["nodez"],
        ["max_duration"],
        ["env", "HF_TOKEN"],
        ["groups", 0, "commandz"],
        ["groups", 1, "resources", "gpu"],
        ["groups", 1, "resources", "cpu"],
        ["groups", 2, "name"],
    ):
        assert loc in found, (loc, found)


def test_a_bad_top_level_key_does_not_hide_a_bad_resources_block(api):
    conf = {"type": "task", "spot_policy": "sometimes", "resources": {"gpu": "A100:80GB:8", "shm": "1GB"}}
    assert locs(plan(api, conf)) == [["spot_policy"], ["resources", "shm"]]


def test_a_fleet_reports_every_problem_at_once(api):
    conf = {"type": "fleet", "backends": ["aws"], "placement": "somewhere", "resources": {"gpu": "H1000"}}
    resp = api.post("/api/projects/main/fleets/", {"configuration": conf}, format="json")
    assert resp.status_code == 400, resp.json()
    found = [e["loc"] for e in resp.json()["errors"]]
    for loc in (["backends"], ["placement"], ["resources", "gpu"], ["name"]):
        assert loc in found, (loc, found)


# ---- 3. group names ------------------------------------------------------------------------------


def test_unnamed_groups_are_named_by_their_index_and_names_may_start_with_a_digit(api):
    conf = {"type": "task", "groups": [{"nodes": 2, "commands": ["a"]}, {"name": "1-decode", "nodes": 1},
                                       {"nodes": 1}]}
    resp = plan(api, conf)
    assert resp.status_code == 200, resp.json()
    layout = [(j["job_num"], j["node_group_name"], j["node_group_index"], j["node_group_rank"])
              for j in resp.json()["jobs"]]
    assert layout == [(0, "0", 0, 0), (1, "0", 0, 1), (2, "1-decode", 1, 0), (3, "2", 2, 0)]


def test_a_group_name_outside_dstacks_rule_is_refused_with_the_rule(api):
    resp = plan(api, {"type": "task", "groups": [{"name": "-x"}, {"name": "Decode"}]})
    errors = resp.json()["errors"]
    assert [e["loc"] for e in errors] == [["groups", 0, "name"], ["groups", 1, "name"]]
    assert "starting with a letter or digit" in errors[0]["msg"]


# ---- 1, 2. dstack's keys, accepted with warnings or refused with a reason -------------------------

TORCHRUN = """
type: task
name: train-distrib
nodes: 2
python: 3.12
env:
  - NCCL_DEBUG=INFO
commands:
  - git clone https://github.com/pytorch/examples.git pytorch-examples
  - cd pytorch-examples/distributed/ddp-tutorial-series
  - uv pip install -r requirements.txt
  - torchrun --nproc-per-node=$DSTACK_GPUS_PER_NODE --node-rank=$DSTACK_NODE_RANK --nnodes=$DSTACK_NODES_NUM
    --master-addr=$DSTACK_MASTER_NODE_IP --master-port=12345 multinode.py 50 10
resources:
  gpu: 24GB:1..2
  shm_size: 24GB
spot_policy: auto
privileged: true
entrypoint: /bin/bash
shell: bash
"""


def test_dstacks_torchrun_example_plans_with_a_warning_for_each_key_without_effect(api):
    resp = plan(api, TORCHRUN)
    assert resp.status_code == 200, resp.json()
    warned = fields(resp)
    assert warned["python"].startswith("python: 3.12 — this server has no default image for Python 3.12")
    assert "host's Python" in warned["python"]
    for key in ("resources.shm_size", "privileged", "entrypoint", "shell", "spot_policy"):
        assert key in warned, (key, warned)
    assert len(resp.json()["jobs"]) == 2
    conf = resp.json()["configuration"]
    assert conf["container"]["python"] == "3.12"
    assert conf["groups"][0]["resources"]["shm_size"] == 24.0


def test_yaml_reads_python_3_10_as_a_number_and_it_still_means_3_10(api):
    resp = plan(api, "type: task\npython: 3.10\ncommands: [python --version]\n")
    assert resp.status_code == 200, resp.json()
    assert resp.json()["configuration"]["container"]["python"] == "3.10"


def test_the_profile_keys_of_dstack_are_all_accepted(api):
    conf = {
        "type": "task", "commands": ["x"], "backends": ["gcp", "remote"], "regions": ["us-central1"],
        "availability_zones": ["us-central1-a"], "instance_types": ["n1-standard-4"], "reservation": "r1",
        "spot_policy": "spot", "max_price": 2, "creation_policy": "reuse", "idle_duration": "5m",
        "stop_duration": "off", "utilization_policy": {"min_gpu_utilization": 10, "time_window": "30m"},
        "retry": {"on_events": ["no-capacity", "error"], "duration": "1d"}, "max_duration": "2h",
        "fleets": ["my-fleet"], "tags": {"team": "ml"}, "priority": 50, "setup": ["echo setup"],
        "registry_auth": {"username": "u", "password": "secret-pass"}, "nvcc": True, "user": "1000:1000",
        "working_dir": "/workflow", "volumes": ["/mnt/data:/data"],
    }
    resp = plan(api, conf)
    assert resp.status_code == 200, resp.json()
    warned = fields(resp)
    for key in ("backends", "regions", "availability_zones", "instance_types", "reservation", "spot_policy",
                "max_price", "creation_policy", "idle_duration", "utilization_policy",
                "tags", "setup", "registry_auth", "nvcc", "user", "working_dir", "volumes"):
        assert key in warned, (key, warned)
    assert "priority" not in warned, "priority orders the waiting runs (docs/queueing.md): no warning"
    assert "stop_duration" not in warned, "stop_duration is the grace of a job's stop: no warning"
    body = resp.json()
    assert body["configuration"]["retry"] == {"on_events": ["no-capacity", "error"], "duration": 86400}
    assert body["configuration"]["groups"][0]["commands"] == ["echo setup", "x"]
    assert "secret-pass" not in str(body), "a registry password is never echoed or stored"


@pytest.mark.parametrize("value", [101, -1, 50.5, "high", True, [50]])
def test_a_priority_outside_0_to_100_or_not_a_whole_number_is_a_400_naming_the_field(api, value):
    resp = plan(api, {"type": "task", "commands": ["x"], "priority": value})
    assert resp.status_code == 400, resp.json()
    (error,) = resp.json()["errors"]
    assert error["loc"] == ["priority"] and "priority must be" in error["msg"], error


@pytest.mark.parametrize("value", ["yes", 1, [True], "true"])
def test_preemptible_that_is_not_true_or_false_is_a_400_naming_the_field(api, value):
    resp = plan(api, {"type": "task", "commands": ["x"], "preemptible": value})
    assert resp.status_code == 400, resp.json()
    (error,) = resp.json()["errors"]
    assert error["loc"] == ["preemptible"] and "preemptible must be true or false" in error["msg"], error


def test_preemptible_and_stop_duration_are_kept_without_a_warning(api):
    resp = plan(api, {"type": "task", "commands": ["x"], "preemptible": True, "stop_duration": "30s"})
    assert resp.status_code == 200, resp.json()
    assert not {"preemptible", "stop_duration"} & set(fields(resp)), fields(resp)
    assert resp.json()["configuration"]["profile"] == {"preemptible": True, "stop_duration": 30}


def test_a_run_without_priority_gets_dstacks_default_and_its_priority_is_kept(api):
    made = api.post("/api/projects/main/runs/", {"configuration": {"type": "task", "commands": ["x"],
                                                                   "priority": 70}}, format="json")
    assert made.status_code == 201 and made.json()["priority"] == 70, made.json()
    made = api.post("/api/projects/main/runs/", {"configuration": {"type": "task", "commands": ["x"]}}, format="json")
    assert made.status_code == 201 and made.json()["priority"] == 0, made.json()


def test_retry_true_is_dstacks_default_policy(api):
    resp = plan(api, {"type": "task", "commands": ["x"], "retry": True})
    assert resp.json()["configuration"]["retry"] == {
        "on_events": ["no-capacity", "interruption", "error"], "duration": 3600}


@pytest.mark.parametrize(("key", "value", "phrase"), [
    ("repos", ["."], "no code upload"),
    ("files", ["../utils:/utils"], "no code upload"),
    ("volumes", ["my-vol:/data"], "Muster has no network volumes"),
    ("backends", ["awss"], "unknown backend"),
])
def test_keys_that_cannot_mean_anything_here_are_a_400_naming_what_muster_supports(api, key, value, phrase):
    resp = plan(api, {"type": "task", "commands": ["x"], key: value})
    assert resp.status_code == 400, resp.json()
    (error,) = resp.json()["errors"]
    assert error["loc"][0] == key and phrase in error["msg"], error


def test_run_args_fill_the_commands(api):
    conf = "type: task\ncommands:\n  - python train.py ${{ run.args }}\n"
    resp = plan(api, conf, args="--epochs 3 '${{ x }}'")
    assert resp.status_code == 200, resp.json()
    assert resp.json()["configuration"]["groups"][0]["commands"] == ["python train.py --epochs 3 '$${{ x }}'"]
    resp = plan(api, conf)
    assert resp.json()["configuration"]["groups"][0]["commands"] == ["python train.py "]


# ---- 12.9: GPU names and duration bounds ----------------------------------------------------------


def test_an_unknown_gpu_name_is_a_400_with_did_you_mean(api):
    resp = plan(api, {"type": "task", "commands": ["x"], "resources": {"gpu": "H1000:8"}})
    assert resp.status_code == 400
    (error,) = resp.json()["errors"]
    assert error["loc"] == ["resources", "gpu"]
    assert "did you mean H100" in error["msg"]


def test_a_gpu_name_probed_on_a_host_of_the_project_is_accepted(api, project):
    conf = {"type": "task", "commands": ["x"], "resources": {"gpu": "X9000:1"}}
    assert plan(api, conf).status_code == 400
    Instance.objects.create(project=project, name="h1", status="idle", backend="ssh", internal_ip="10.0.0.9",
                            resources={"cpus": 8, "gpus": [{"name": "X9000", "memory_gb": 48, "vendor": "nvidia"}]})
    resp = plan(api, conf)
    assert resp.status_code == 200, resp.json()
    assert resp.json()["configuration"]["groups"][0]["resources"]["gpu"]["names"] == ["X9000"]


@pytest.mark.parametrize("key", ["max_duration", "retry"])
def test_an_overflowing_duration_is_a_400(api, key):
    value = "99999999999999999999d" if key == "max_duration" else {"duration": "99999999999999999999d"}
    resp = plan(api, {"type": "task", "commands": ["x"], key: value})
    assert resp.status_code == 400
    assert "too long" in resp.json()["errors"][0]["msg"]


# ---- fleets: spot_policy -----------------------------------------------------------------------------


def test_spot_policy_spot_makes_a_gcp_fleet_create_spot_slices(api):
    conf = {"type": "fleet", "name": "tpu", "backends": ["gcp"], "spot_policy": "spot", "zones": ["us-central1-a"]}
    resp = api.post("/api/projects/main/fleets/", {"configuration": conf}, format="json")
    assert resp.status_code == 201, resp.json()
    from instances.models import Fleet

    assert Fleet.objects.get(name="tpu").configuration["spot"] is True


# ---- dstack's ${{ secrets.NAME }} in env values ----------------------------------------------------


def test_a_secret_reference_in_env_is_filled_from_the_project_and_never_shown(api, project):
    from projects.models import Secret

    secret = Secret(project=project, name="hf_token")
    secret.value = "hf_very_secret"
    secret.save()
    conf = "type: task\nname: sec\nenv:\n  - HF_TOKEN=${{ secrets.hf_token }}\ncommands: [echo]\n"
    resp = plan(api, conf)
    assert resp.status_code == 200, resp.json()
    assert resp.json()["configuration"]["groups"][0]["env"]["HF_TOKEN"] == "***"
    assert "hf_very_secret" not in str(resp.json())
    resp = api.post("/api/projects/main/runs/", {"configuration": conf}, format="json")
    assert resp.status_code == 201, resp.json()
    assert "hf_very_secret" not in str(resp.json())
    from runs.job_rows import secret_env
    from runs.models import Run

    run = Run.objects.get(name="sec")
    assert "hf_very_secret" not in str(run.configuration) and "hf_very_secret" not in str(run.jobs.get().spec)
    assert secret_env(run) == {"HF_TOKEN": "hf_very_secret"}


def test_a_missing_secret_or_one_in_commands_is_a_400_at_its_place(api):
    conf = {"type": "task", "env": {"A": "${{ secrets.nope }}"}, "commands": ["echo ${{ secrets.nope }}"]}
    resp = plan(api, conf)
    assert resp.status_code == 400
    errors = {tuple(e["loc"]): e["msg"] for e in resp.json()["errors"]}
    assert "secret `nope` does not exist" in errors[("env", "A")]
    assert "can only be used in env values" in errors[("commands", 0)]


def test_container_keys_take_effect_with_an_image_and_warn_without_one(api):
    keys = ("privileged: true\nuser: 1000:1000\nentrypoint: /bin/bash\nworking_dir: /w\nshell: bash\n"
            "volumes: [/mnt/data:/data]\nresources: {shm_size: 8GB}\ncommands: [echo]\n")
    with_image = plan(api, "type: task\nimage: busybox\n" + keys)
    assert with_image.status_code == 200, with_image.json()
    assert not set(fields(with_image)) & {"privileged", "user", "entrypoint", "working_dir", "shell", "volumes",
                                          "resources.shm_size", "image"}, fields(with_image)
    groups = plan(api, "type: task\ngroups:\n  - name: a\n    image: busybox\n    commands: [echo]\n")
    assert "groups.0.image" not in fields(groups)
    without = fields(plan(api, "type: task\n" + keys))
    for key in ("privileged", "user", "entrypoint", "working_dir", "shell", "volumes", "resources.shm_size"):
        assert "only for jobs with `image`" in without[key] or "for jobs with `image`" in without[key], without
