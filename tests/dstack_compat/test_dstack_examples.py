"""dstack's own examples and docs, planned through Muster's API unchanged.

Each file under configs/ is a configuration from dstack's repository (its first line names the
file and commit). The expected layouts are written from dstack's semantics, not from Muster's
output: a task runs one job per node, job_num 0..nodes-1, job 0 the master; a TPU slice has one
node per host. Muster puts the nodes of a `nodes:` task in one implicit group named `default`
(index 0), so a job's rank in its group is its job_num.

Besides acceptance and layout, each plan must say something about every key it does not act on:
a written key is either one Muster implements or it has a warning (nothing is silently ignored).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from runs.configuration import ConfigurationError, parse_fleet_configuration

pytestmark = pytest.mark.django_db

CONFIGS = Path(__file__).parent / "configs"

# file -> number of nodes dstack runs it on
TASKS = {
    "torchrun.dstack.yml": 2,
    "axolotl-distrib.dstack.yml": 2,
    "trl-fsdp-distrib.dstack.yml": 2,
    "trl-deepspeed-distrib.dstack.yml": 2,
    "ray-ragen.dstack.yml": 2,
    "open-r1.dstack.yml": 2,
    "a3high-nccl-tests.dstack.yml": 2,
    "nccl-tests-mpi.dstack.yml": 2,
    "rccl-tests-mpi.dstack.yml": 2,
    "a3mega-nccl-tests.dstack.yml": 2,
    "agent-fine-tuning.dstack.yml": 2,
    "ray-cluster.dstack.yml": 4,
    "efa-nccl-tests.dstack.yml": 2,
    "rccl-tests-fifo.dstack.yml": 2,
    "spark-cluster.dstack.yml": 2,
    "trl-train.dstack.yml": 1,
    "trl-train-distrib.dstack.yml": 2,
    "trl-amd.dstack.yml": 1,
    "alignment-handbook-distrib.dstack.yml": 2,
    "axolotl-train.dstack.yml": 1,
    "axolotl-amd.dstack.yml": 1,
    "tpu-train.dstack.yml": 1,  # v5litepod-8: one host
    "optimum-tpu-llama31.dstack.yml": 1,
    "pytorch-distributed.dstack.yml": 2,
    "qlora-run-args.dstack.yml": 1,
    "docs-trl-sft.dstack.yml": 1,
    "docs-streamlit-ports.dstack.yml": 1,
    "docs-distributed-torchrun.dstack.yml": 2,
    "docs-resources.dstack.yml": 1,
    "docs-nvcc.dstack.yml": 1,
    "docs-custom-image-shell.dstack.yml": 1,
    "docs-docker-in-docker.dstack.yml": 1,
    "docs-private-registry.dstack.yml": 1,
    "docs-env.dstack.yml": 1,
    "docs-retry.dstack.yml": 1,
    "docs-priority.dstack.yml": 1,
    "docs-utilization-policy.dstack.yml": 1,
    "docs-schedule.dstack.yml": 1,
}
# Keys Muster acts on as dstack does; any other written key must come with a warning.
IMPLEMENTED = {"type", "name", "nodes", "env", "commands", "resources", "startup_order", "stop_criteria",
               "retry", "max_duration", "fleets", "priority"}
IMPLEMENTED_RESOURCES = {"cpu", "memory", "disk", "gpu"}
# With `image` the jobs run in containers, where these take effect too.
IMPLEMENTED_WITH_IMAGE = {"image", "privileged", "user", "entrypoint", "working_dir", "shell", "volumes",
                          "registry_auth"}
# dstack accepts these; Muster refuses them on purpose, naming why (it has no code upload).
REFUSED = {"refused-docs-files.dstack.yml": "files", "refused-docs-repos.dstack.yml": "repos"}


def _text(name: str) -> str:
    text = (CONFIGS / name).read_text()
    assert text.startswith("# source: dstackai/dstack "), f"{name} must name its source"
    return text


def _bare_env(doc: dict) -> dict[str, str]:
    """dstack asks for a value for every bare env key; so does Muster."""
    env = doc.get("env") or []
    return {e: f"value-of-{e}" for e in env if isinstance(e, str) and "=" not in e}


def test_the_suite_has_at_least_30_of_dstacks_configurations():
    assert len(TASKS) >= 30
    on_disk = {p.name for p in CONFIGS.glob("*.dstack.yml")}
    # services: tests/dstack_compat/test_dstack_service_examples.py
    assert set(TASKS) | set(REFUSED) | {n for n in on_disk if n.startswith(("fleet-", "service-"))} == on_disk


@pytest.mark.parametrize("name", sorted(TASKS))
def test_a_dstack_example_plans_with_dstacks_job_layout(api, name):
    text = _text(name)
    doc = yaml.safe_load(text)
    resp = api.post("/api/projects/main/runs/plan",
                    {"configuration": text, "env": _bare_env(doc), "args": "--epochs 1"}, format="json")
    assert resp.status_code == 200, resp.json()
    body = resp.json()
    nodes = TASKS[name]
    layout = [(j["job_num"], j["node_group_name"], j["node_group_index"], j["node_group_rank"])
              for j in body["jobs"]]
    assert layout == [(i, "default", 0, i) for i in range(nodes)]

    warned = {w["field"] for w in body["warnings"]}
    image = bool(doc.get("image"))
    for key in doc:
        if key not in IMPLEMENTED | (IMPLEMENTED_WITH_IMAGE if image else set()):
            assert key in warned, f"{key} is written, not implemented, and has no warning: {warned}"
    for key in (doc.get("resources") or {}):
        if key not in IMPLEMENTED_RESOURCES | ({"shm_size"} if image else set()):
            assert f"resources.{key}" in warned, (key, warned)


def test_run_args_of_the_qlora_example_are_filled(api):
    text = _text("qlora-run-args.dstack.yml")
    body = {"configuration": text, "env": {"HUGGING_FACE_HUB_TOKEN": "t"}, "args": "--epochs 1"}
    resp = api.post("/api/projects/main/runs/plan", body, format="json")
    assert resp.json()["configuration"]["groups"][0]["commands"][-1] == "python examples/fine-tuning/qlora/train.py --merge_and_push --epochs 1"


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_code_upload_examples_are_refused_naming_why(api, name):
    text = _text(name)
    resp = api.post("/api/projects/main/runs/plan",
                    {"configuration": text, "env": _bare_env(yaml.safe_load(text))}, format="json")
    assert resp.status_code == 400
    (error,) = resp.json()["errors"]
    assert error["loc"] == [REFUSED[name]] and "no code upload" in error["msg"]


@pytest.mark.parametrize("name", ["fleet-ssh.dstack.yml", "fleet-ssh-env.dstack.yml"])
def test_dstacks_ssh_fleet_examples_are_accepted(name):
    # Parsed, not applied: applying an SSH fleet connects to its hosts (tests/ssh covers that).
    conf = parse_fleet_configuration(_text(name))
    assert [h.hostname for h in conf.ssh_config.hosts] == ["3.255.177.51", "3.255.177.52"]
    assert ("env" in {w["field"] for w in conf.warnings}) == ("env" in yaml.safe_load(_text(name)))


def test_a_cloud_fleet_without_a_backend_is_refused_naming_what_muster_has():
    # dstack picks any configured cloud; Muster creates only gcp TPU slices and local instances.
    with pytest.raises(ConfigurationError) as raised:
        parse_fleet_configuration(_text("fleet-cloud-axolotl.dstack.yml"))
    assert raised.value.errors == [{"loc": ["ssh_config"], "msg": (
        "set `ssh_config` (hosts you have) or `backends` (instances to create)")}]
