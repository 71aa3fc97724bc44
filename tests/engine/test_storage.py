"""A group's commands and env are stored once, not once per node; the plan states them once; the
total a run hands out to its nodes is capped; each node's runner still gets all of it."""

from __future__ import annotations

import json
import secrets

import pytest
import yaml
from django.db import connection
from django.db.models import Sum, TextField
from django.db.models.functions import Cast, Length

from instances.services.fleets import create_local_fleet
from runs.models import Job, Run
from runs.services import logs
from tests.engine.helpers import wait_for_run

NODES = 1000


def big_task(lines: int, nodes: int, name: str = "wide") -> str:
    # random words, so the database cannot compress away a copy per node
    commands = [f"echo {secrets.token_hex(24)}" for _ in range(lines)]
    return yaml.safe_dump({"type": "task", "name": name, "nodes": nodes, "env": ["HF_TOKEN", "MODEL=llama"],
                           "commands": commands})


def stored_bytes() -> int:
    """Bytes of the runs' and jobs' JSON as the database holds them (any backend)."""
    jobs = Job.objects.aggregate(n=Sum(Length(Cast("spec", TextField()))))["n"] or 0
    runs = Run.objects.aggregate(n=Sum(Length(Cast("configuration", TextField()))))["n"] or 0
    return jobs + runs


def table_bytes() -> int | None:
    """On PostgreSQL, what the run and job tables take on disk, TOAST and indexes included."""
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_total_relation_size('runs_job') + pg_total_relation_size('runs_run')")
        return cursor.fetchone()[0]


@pytest.mark.django_db
def test_a_thousand_node_submit_stores_its_commands_once(api):
    text = big_task(2000, NODES)  # about 100 KB of commands
    body = {"configuration": text, "env": {"HF_TOKEN": "hf_x"}}
    before, disk_before = stored_bytes(), table_bytes()
    answer = api.post("/api/projects/main/runs/", body, format="json")
    assert answer.status_code == 201, answer.content[:500]
    assert Job.objects.filter(run__name="wide").count() == NODES
    grown = stored_bytes() - before
    # the document once, plus a few hundred bytes per job for its place and resources
    assert grown < 2 * len(text) + NODES * 1000, f"{grown} bytes stored for a {len(text)}-byte document"
    if disk_before is not None:
        disk_grown = table_bytes() - disk_before
        assert disk_grown < 4 * len(text) + NODES * 2000, f"tables grew by {disk_grown} bytes"


@pytest.mark.django_db
def test_the_plan_of_a_thousand_nodes_states_their_commands_once(api):
    text = big_task(2000, NODES)
    answer = api.post("/api/projects/main/runs/plan", {"configuration": text, "env": {"HF_TOKEN": "x"}},
                      format="json")
    assert answer.status_code == 200, answer.content[:500]
    assert len(answer.content) < 2 * len(text) + NODES * 200, f"{len(answer.content)} bytes of plan"
    plan = answer.json()
    assert len(plan["jobs"]) == NODES and plan["jobs"][-1]["job_num"] == NODES - 1
    assert len(plan["configuration"]["groups"][0]["commands"]) == 2000


@pytest.mark.django_db
def test_a_run_that_hands_out_more_than_the_limit_is_a_400_saying_by_how_much(api, settings):
    settings.MUSTER = {**settings.MUSTER, "MAX_EXPANDED_BYTES": 1_000_000}
    text = big_task(200, 100)  # about 10 KB per node, 1 MB over 100 nodes
    answer = api.post("/api/projects/main/runs/", {"configuration": text, "env": {"HF_TOKEN": "x"}}, format="json")
    assert answer.status_code == 400, answer.content[:500]
    [error] = answer.json()["errors"]
    assert error["loc"] == ["nodes"]
    per_node = len(json.dumps({"commands": yaml.safe_load(text)["commands"], "env": {"HF_TOKEN": "x", "MODEL": "llama"}}))
    over = (per_node * 100 - 1_000_000) / 1e6
    assert f"{over:.1f} MB over the limit of 1.0 MB (MUSTER_MAX_EXPANDED_BYTES)" in error["msg"], error["msg"]
    assert f"100 nodes x {per_node / 1e6:.1f} MB" in error["msg"]
    assert not Run.objects.exists()
    plan = api.post("/api/projects/main/runs/plan", {"configuration": text, "env": {"HF_TOKEN": "x"}},
                    format="json")
    assert plan.status_code == 400 and plan.json()["errors"] == [error]


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_every_node_still_runs_every_command_with_its_env(api, fast_limits, celery_worker):
    from projects.models import Project

    fleet = create_local_fleet(Project.objects.get(name="main"), "local", 2)
    doc = yaml.safe_load(big_task(300, 2, name="full"))
    doc["commands"].append('echo "token=$HF_TOKEN model=$MODEL rank=$DSTACK_NODE_RANK"')
    answer = api.post("/api/projects/main/runs/", {"configuration": yaml.safe_dump(doc),
                                                   "env": {"HF_TOKEN": "hf_secret"}}, format="json")
    assert answer.status_code == 201, answer.content[:500]
    run = wait_for_run("full", timeout=60)
    assert run.status == "done", [(j.job_num, j.status, j.termination_message) for j in run.current_jobs()]
    for job in run.current_jobs():
        out = logs.read(job).decode()
        for command in doc["commands"][:-1]:
            assert command[5:] in out, f"job {job.job_num} did not run `{command}`"
        assert f"token=hf_secret model=llama rank={job.job_num}" in out
    from engine.groups import terminate_fleet_instances

    terminate_fleet_instances(fleet)
