"""bench/peer's dstack client builds the requests dstack 0.22.5's own server schemas accept (read in
.venv-dstack): a plan of the bench's 4-node task, the apply built from a plan, and the no-capacity
variant asking 8 A100s per node; extra keys would be refused, as the real server refuses them."""

from __future__ import annotations

import json
import subprocess

import pytest

from bench.peer import dstack_api
from tests.dstack_cli.helpers import ROOT, dstack_python

pytestmark = [pytest.mark.dstack_cli]

CHECK = ("import json, sys\n"
         "from dstack._internal.server.schemas.runs import ApplyRunPlanRequest, GetRunPlanRequest\n"
         "body = json.loads(sys.stdin.read())\n"
         "plan = GetRunPlanRequest.model_validate(body['plan'])\n"
         "apply = ApplyRunPlanRequest.model_validate(body['apply'])\n"
         "c = plan.run_spec.configuration\n"
         "g = c.resources.gpu\n"
         "print(json.dumps({'nodes': c.nodes, 'commands': c.commands, 'gpu': [g.name, g.count.min, g.count.max],\n"
         "                  'retry': c.retry, 'cpu_min': c.resources.cpu.count.min, 'run_name': plan.run_spec.run_name,\n"
         "                  'apply_nodes': apply.plan.run_spec.configuration.nodes}))\n")


def validated(gpu: str | None) -> dict:
    spec = dstack_api.run_spec(4, gpu)
    body = {"plan": dstack_api.plan_body(spec), "apply": dstack_api.apply_body({"run_spec": spec})}
    done = subprocess.run([str(dstack_python()), "-c", CHECK], input=json.dumps(body), capture_output=True,
                          text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_the_bench_task_is_a_4_node_task_to_dstacks_own_request_models():
    got = validated(None)
    assert got["nodes"] == 4 and got["apply_nodes"] == 4
    assert got["commands"] == ["echo"]
    assert got["run_name"] is None  # the server names each run
    assert got["cpu_min"] == 2  # the CLI's client-side default, as it sends it


def test_the_no_capacity_task_asks_eight_a100s_per_node_without_retry():
    got = validated("A100:8")
    assert got["gpu"] == [["A100"], 8, 8]
    assert got["retry"] is False
