"""From a configuration to its jobs: one global rank space in written order."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from runs.configuration import expand_jobs, parse_run_configuration

SEED = Path("/work/shared/seeds/004_c84aadd98faf2368.txt")


def seed_task_yaml() -> str:
    """The PD-disaggregation sample of the seed discussion, as its author wrote it."""
    text = SEED.read_text()
    start = text.index("type: task")
    return text[start : text.index("SSH-Fleet", start)]


@pytest.fixture
def pd_jobs() -> list:
    if not SEED.exists():
        pytest.skip("seed discussion not present")
    conf = parse_run_configuration(seed_task_yaml(), env_values={"HF_TOKEN": "hf_x"})
    return expand_jobs(conf)


def test_seed_pd_disaggregation_becomes_three_ranked_jobs(pd_jobs: list) -> None:
    assert [j.job_num for j in pd_jobs] == [0, 1, 2]
    assert [j.node_group_name for j in pd_jobs] == ["router", "prefill", "decode"]
    assert [j.node_group_index for j in pd_jobs] == [0, 1, 2]
    assert [j.node_group_rank for j in pd_jobs] == [0, 0, 0]
    assert all(j.nodes_in_group == 1 for j in pd_jobs)


def test_seed_router_keeps_its_references_for_start_time(pd_jobs: list) -> None:
    router = pd_jobs[0]
    script = router.commands[1]
    assert re.findall(r"\$\{\{ groups\[(\d)\]\.nodes\[0\]\.IP_ADDRESS \}\}", script) == ["1", "2", "1", "2"]
    assert router.ports == [8000]
    assert router.resources["cpu"] == {"min": 4, "max": 4, "arch": "x86"}
    assert router.resources["gpu"] is None


def test_seed_workers_carry_their_own_resources_and_shared_env(pd_jobs: list) -> None:
    prefill, decode = pd_jobs[1], pd_jobs[2]
    for job in (prefill, decode):
        assert job.resources["gpu"]["names"] == ["L40S"]
        assert job.resources["gpu"]["vendor"] == "nvidia"
        assert job.image == "lmsysorg/sglang:latest"
        assert job.env == {"HF_TOKEN": "hf_x", "MODEL_ID": "meta-llama/Llama-3.2-3B-Instruct"}
    assert "--disaggregation-mode prefill" in prefill.commands[0]
    assert "--disaggregation-mode decode" in decode.commands[0]


def test_jobs_are_json_safe(pd_jobs: list) -> None:
    payload = json.loads(json.dumps([j.as_dict() for j in pd_jobs]))
    assert payload[2]["node_group_name"] == "decode"
    assert payload[0]["commands"] == pd_jobs[0].commands


def test_ranks_run_through_groups_in_written_order() -> None:
    conf = parse_run_configuration(
        {
            "type": "task",
            "groups": [
                {"name": "a", "nodes": 3, "commands": ["a"]},
                {"name": "b", "nodes": 1},
                {"name": "c", "nodes": 2, "env": {"ROLE": "c"}},
            ],
        }
    )
    jobs = expand_jobs(conf)
    assert [(j.job_num, j.node_group_name, j.node_group_rank, j.nodes_in_group) for j in jobs] == [
        (0, "a", 0, 3),
        (1, "a", 1, 3),
        (2, "a", 2, 3),
        (3, "b", 0, 1),
        (4, "c", 0, 2),
        (5, "c", 1, 2),
    ]
    assert jobs[5].env == {"ROLE": "c"}
    assert jobs[3].commands == []


def test_a_nodes_task_is_one_group_named_default() -> None:
    jobs = expand_jobs(parse_run_configuration({"type": "task", "nodes": 2, "commands": ["torchrun x.py"]}))
    assert [(j.job_num, j.node_group_name, j.node_group_index, j.node_group_rank) for j in jobs] == [
        (0, "default", 0, 0),
        (1, "default", 0, 1),
    ]


def test_a_tpu_task_has_one_job_per_host_of_the_slice() -> None:
    jobs = expand_jobs(parse_run_configuration({"type": "task", "resources": {"gpu": "tpu-v4-32"}}))
    assert len(jobs) == 4
    assert {j.resources["gpu"]["tpu"] for j in jobs} == {"v4-32"}
    assert [j.node_group_rank for j in jobs] == [0, 1, 2, 3]


def test_jobs_do_not_share_mutable_state() -> None:
    jobs = expand_jobs(parse_run_configuration({"type": "task", "nodes": 2, "env": {"A": "1"}}))
    jobs[0].env["A"] = "changed"
    jobs[0].resources["cpu"]["min"] = 99
    assert jobs[1].env == {"A": "1"}
    assert jobs[1].resources["cpu"]["min"] == 1
