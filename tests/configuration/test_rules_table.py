"""Every rule of the configuration language for tasks, one row each: what a user writes and what
they get (tests/configuration/rules.py says how a row is checked; fleets: test_rules_table_fleets.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.configuration.rules import REF, bad, check_rule, ok, task, two_groups, yaml
from tests.configuration.test_rules_table_fleets import FLEET_CASES

CASES = [
    # ---- nodes and groups ------------------------------------------------------------------
    ok(
        "nodes-task",
        task(nodes=2, commands=["echo hi"]),
        {"nodes": 2, "groups.0.name": "default", "uses_groups": False},
    ),
    ok("no-nodes-means-one", task(commands=["echo hi"]), {"nodes": 1, "groups.0.nodes": 1}),
    ok(
        "groups-in-order",
        two_groups(),
        {"nodes": 3, "groups.0.name": "router", "groups.1.nodes": 2, "uses_groups": True},
    ),
    ok("group-without-nodes-has-one", task(groups=[{"name": "a"}]), {"groups.0.nodes": 1}),
    bad("nodes-with-groups", two_groups(nodes=3), ["nodes"], "cannot be used together"),
    bad("top-commands-with-groups", two_groups(commands=["x"]), ["commands"], "set them per group"),
    bad("top-ports-with-groups", two_groups(ports=[80]), ["ports"], "set them per group"),
    bad("top-resources-with-groups", two_groups(resources={"cpu": 2}), ["resources"], "set them per group"),
    bad("empty-groups", task(groups=[]), ["groups"], "at least one group"),
    bad(
        "duplicate-group-names", two_groups(second={"name": "router"}), ["groups", 1, "name"], "already used"
    ),
    bad(
        "uppercase-group-name",
        two_groups(first={"name": "Router"}),
        ["groups", 0, "name"],
        "not a valid group name",
    ),
    bad("long-group-name", two_groups(first={"name": "a" * 41}), ["groups", 0, "name"], "at most 40"),
    # dstack names unnamed groups by their index, and lets a group name start with a digit
    ok(
        "unnamed-groups-get-their-index",
        task(groups=[{"nodes": 1}, {"name": "b"}, {"nodes": 2}]),
        {"groups.0.name": "0", "groups.1.name": "b", "groups.2.name": "2"},
    ),
    ok("group-name-starting-with-digit", task(groups=[{"name": "0-prefill"}]), {"groups.0.name": "0-prefill"}),
    bad(
        "unnamed-group-clashes-with-a-name",
        task(groups=[{"name": "1"}, {"nodes": 1}]),
        ["groups", 1, "name"],
        "already used",
    ),
    bad("group-nodes-zero", two_groups(second={"nodes": 0}), ["groups", 1, "nodes"], "at least 1"),
    bad("group-nodes-negative", two_groups(first={"nodes": -2}), ["groups", 0, "nodes"], "at least 1"),
    bad("task-nodes-zero", task(nodes=0), ["nodes"], "at least 1"),
    bad(
        "groups-over-node-limit",
        two_groups(first={"nodes": 5}, second={"nodes": 4}, max_duration=None),
        ["groups"],
        "the limit is 8",
        max_nodes=8,
    ),
    bad("nodes-over-default-limit", task(nodes=5000), ["nodes"], "the limit is 4096"),
    bad("group-is-not-a-mapping", task(groups=["router"]), ["groups", 0], "expected a mapping"),
    bad("task-name-not-slug", task(name="My Run"), ["name"], "not a valid name"),
    # ---- unknown keys and wrong types ------------------------------------------------------
    bad("unknown-top-key", task(comands=["x"]), ["comands"], "unknown key `comands`"),
    bad(
        "unknown-group-key",
        two_groups(second={"comand": "x"}),
        ["groups", 1, "comand"],
        "unknown key `comand`",
    ),
    bad(
        "unknown-resources-key",
        two_groups(first={"resources": {"gpus": 1}}),
        ["groups", 0, "resources", "gpus"],
        "unknown key `gpus`",
    ),
    bad(
        "unknown-gpu-object-key",
        task(resources={"gpu": {"names": "H100"}}),
        ["resources", "gpu", "names"],
        "unknown key `names`",
    ),
    bad("unknown-retry-key", task(retry={"durations": "1h"}), ["retry", "durations"], "unknown key"),
    bad("nodes-as-text", task(nodes="two"), ["nodes"], "expected a whole number"),
    bad("nodes-as-boolean", task(nodes=True), ["nodes"], "expected a whole number"),
    bad("commands-not-a-list", task(commands="echo hi"), ["commands"], "expected a list"),
    bad("command-not-a-string", task(commands=["ok", 5]), ["commands", 1], "expected a string"),
    bad("startup-order-unknown", task(startup_order="random"), ["startup_order"], "workers-first"),
    ok(
        "stop-criteria-master-done",
        task(stop_criteria="master-done", startup_order="master-first"),
        {"stop_criteria": "master-done", "startup_order": "master-first"},
    ),
    ok(
        "defaults-of-a-task",
        task(),
        {
            "startup_order": "any",
            "stop_criteria": "all-done",
            "retry": None,
            "max_duration": None,
            "fleets": [],
        },
    ),
    ok("fleets-listed", task(fleets=["pd-disagg"]), {"fleets": ["pd-disagg"]}),
    # ---- resources, vendors, images, cpu arch (per group as at the top) ----------------------
    ok(
        "group-without-resources-gets-defaults",
        two_groups(),
        {
            "groups.0.resources": {
                "cpu": {"min": 1, "max": None, "arch": "x86"},
                "memory": {"min": 1.0, "max": None},
                "disk": {"min": 1.0, "max": None},
                "gpu": None,
                "shm_size": None,
            }
        },
    ),
    ok(
        "top-defaults-equal-group-defaults",
        task(),
        {"groups.0.resources.cpu": {"min": 1, "max": None, "arch": "x86"}, "groups.0.resources.gpu": None},
    ),
    ok(
        "vendor-inferred-per-group",
        two_groups(
            first={"resources": {"gpu": "L40S"}},
            second={"resources": {"gpu": "MI300X:8"}, "image": "rocm/vllm"},
        ),
        {
            "groups.0.resources.gpu.vendor": "nvidia",
            "groups.1.resources.gpu.vendor": "amd",
            "groups.1.resources.gpu.count": {"min": 8, "max": 8},
        },
    ),
    bad(
        "amd-group-without-image",
        two_groups(second={"resources": {"gpu": "MI300X"}}),
        ["groups", 1, "resources", "gpu"],
        "set `image`",
    ),
    bad(
        "amd-task-without-image", task(resources={"gpu": "amd:MI300X:8"}), ["resources", "gpu"], "set `image`"
    ),
    bad(
        "intel-group-without-image",
        two_groups(first={"resources": {"gpu": "Gaudi2"}}),
        ["groups", 0, "resources", "gpu"],
        "set `image`",
    ),
    ok(
        "amd-group-uses-top-image",
        two_groups(second={"resources": {"gpu": "MI300X"}}, image="rocm/vllm"),
        {"groups.1.image": "rocm/vllm", "groups.1.resources.gpu.vendor": "amd"},
    ),
    ok(
        "nvidia-needs-no-image",
        task(resources={"gpu": "H100:8"}),
        {"groups.0.resources.gpu.vendor": "nvidia", "groups.0.image": None},
    ),
    bad("unknown-gpu-name", task(resources={"gpu": "H1000:8"}), ["resources", "gpu"], "did you mean H100"),
    ok(
        "probed-gpu-name-keeps-no-vendor",
        task(resources={"gpu": "Z9000"}),
        {"groups.0.resources.gpu.vendor": None, "groups.0.resources.gpu.names": ["Z9000"]},
        probed_gpu_names=lambda: ["Z9000"],
    ),
    bad(
        "vendor-contradicts-name",
        task(resources={"gpu": "nvidia:MI300X"}),
        ["resources", "gpu"],
        "made by amd",
    ),
    bad(
        "object-vendor-contradicts-name",
        two_groups(first={"resources": {"gpu": {"vendor": "amd", "name": "H100"}}}, image="x"),
        ["groups", 0, "resources", "gpu"],
        "made by nvidia",
    ),
    ok(
        "gb200-implies-arm",
        two_groups(second={"resources": {"gpu": "GB200:4"}}),
        {"groups.1.resources.cpu.arch": "arm", "groups.0.resources.cpu.arch": "x86"},
    ),
    bad(
        "gb200-with-x86",
        two_groups(second={"resources": {"gpu": "GB200", "cpu": "x86:8"}}),
        ["groups", 1, "resources", "cpu"],
        "arm",
    ),
    ok(
        "arm-cpu-written",
        task(resources={"cpu": "arm:8"}),
        {"groups.0.resources.cpu": {"min": 8, "max": 8, "arch": "arm"}},
    ),
    bad(
        "memory-range-reversed",
        task(resources={"memory": "64GB..16GB"}),
        ["resources", "memory"],
        "greater than",
    ),
    bad("cpu-not-a-count", task(resources={"cpu": "lots"}), ["resources", "cpu"], "not a whole number"),
    # ---- TPU slices ------------------------------------------------------------------------
    ok(
        "tpu-slice-sets-nodes",
        task(resources={"gpu": "tpu-v2-32"}),
        {
            "nodes": 4,
            "groups.0.resources.gpu.tpu": "v2-32",
            "groups.0.resources.gpu.vendor": "google",
            "groups.0.resources.gpu.count": {"min": 4, "max": 4},
        },
    ),
    ok("bare-slice-name", task(resources={"gpu": "v2-32"}), {"nodes": 4}),
    ok("tpu-prefix-slice", task(resources={"gpu": "tpu:v2-32"}), {"nodes": 4}),
    ok("tpu-matching-nodes", task(nodes=4, resources={"gpu": "v2-32"}), {"nodes": 4}),
    ok(
        "single-host-v4-8",
        task(resources={"gpu": "v4-8"}),
        {"nodes": 1, "groups.0.resources.gpu.tpu": "v4-8"},
    ),
    ok(
        "v5litepod-16-has-4-hosts",
        task(resources={"gpu": "v5litepod-16"}),
        {"nodes": 4, "groups.0.resources.gpu.count.min": 4},
    ),
    ok("tpu-needs-no-image", task(resources={"gpu": "tpu:v6e-8"}), {"nodes": 1, "groups.0.image": None}),
    bad(
        "tpu-nodes-disagree",
        task(nodes=3, resources={"gpu": "tpu-v2-32"}),
        ["nodes"],
        "v2-32 has 4 hosts: set nodes: 4 or leave nodes out",
    ),
    ok(
        "tpu-group-takes-host-count",
        two_groups(second={"nodes": None, "resources": {"gpu": "v2-32"}}),
        {"groups.1.nodes": 4, "nodes": 5},
    ),
    bad(
        "tpu-group-nodes-disagree",
        two_groups(second={"resources": {"gpu": "v2-32"}}),
        ["groups", 1, "nodes"],
        "set nodes: 4",
    ),
    bad(
        "unknown-slice-size", task(resources={"gpu": "v2-12"}), ["resources", "gpu"], "valid v2 slices: v2-8"
    ),
    bad("unknown-slice-family", task(resources={"gpu": "v7-8"}), ["resources", "gpu"], "known families"),
    # ---- retry and durations ---------------------------------------------------------------
    ok(
        "retry-true",
        task(retry=True),
        {"retry": {"on_events": ["no-capacity", "interruption", "error"], "duration": 3600}},
    ),
    ok("retry-false", task(retry=False), {"retry": None}),
    ok(
        "retry-duration-only",
        task(retry={"duration": "1h30m"}),
        {"retry.duration": 5400, "retry.on_events": ["no-capacity", "interruption", "error"]},
    ),
    ok(
        "retry-some-events",
        task(retry={"on_events": ["no-capacity"], "duration": 600}),
        {"retry": {"on_events": ["no-capacity"], "duration": 600}},
    ),
    bad("retry-no-events", task(retry={"on_events": []}), ["retry", "on_events"], "at least one event"),
    bad("retry-negative-duration", task(retry={"duration": -5}), ["retry", "duration"], "negative"),
    bad("retry-unknown-event", task(retry={"on_events": ["oom"]}), ["retry", "on_events", 0], "no-capacity"),
    ok("max-duration-off", task(max_duration="off"), {"max_duration": None}),
    ok("max-duration-hours", task(max_duration="2h"), {"max_duration": 7200}),
    ok("max-duration-seconds", task(max_duration=90), {"max_duration": 90}),
    bad("max-duration-garbage", task(max_duration="soon"), ["max_duration"], "cannot read duration"),
    # ---- ${{ }} references -----------------------------------------------------------------
    ok(
        "reference-kept-in-commands",
        two_groups(first={"commands": [f"curl http://{REF}:8000"]}),
        {"groups.0.commands": [f"curl http://{REF}:8000"]},
    ),
    ok(
        "reference-last-node-of-group",
        two_groups(first={"commands": ["${{groups[1].nodes[1].IP_ADDRESS}}"]}),
        {"nodes": 3},
    ),
    ok(
        "reference-into-tpu-group",
        two_groups(
            first={"commands": ["${{ groups[1].nodes[3].IP_ADDRESS }}"]},
            second={"nodes": None, "resources": {"gpu": "v2-32"}},
        ),
        {"nodes": 5},
    ),
    ok(
        "escaped-reference-is-text",
        task(commands=["echo $${{ groups[9].nodes[9].IP_ADDRESS }}"]),
        {"nodes": 1},
    ),
    bad(
        "reference-group-out-of-range",
        two_groups(second={"commands": ["a", "${{ groups[2].nodes[0].IP_ADDRESS }}"]}),
        ["groups", 1, "commands", 1],
        "groups[2] does not exist",
    ),
    bad(
        "reference-node-out-of-range",
        two_groups(first={"commands": ["${{ groups[1].nodes[2].IP_ADDRESS }}"]}),
        ["groups", 0, "commands", 0],
        "nodes[2] does not exist",
    ),
    bad(
        "reference-unknown-attribute",
        two_groups(first={"commands": ["${{ groups[1].nodes[0].HOSTNAME }}"]}),
        ["groups", 0, "commands", 0],
        "`HOSTNAME` is not a node attribute",
    ),
    bad(
        "reference-missing-attribute",
        two_groups(first={"commands": ["${{ groups[1].nodes[0] }}"]}),
        ["groups", 0, "commands", 0],
        "cannot read",
    ),
    bad(
        "reference-letter-index",
        two_groups(first={"commands": ["${{ groups[a].nodes[0].IP_ADDRESS }}"]}),
        ["groups", 0, "commands", 0],
        "cannot read",
    ),
    bad(
        "reference-unclosed",
        two_groups(first={"commands": ["ok", "echo ${{ groups[1].nodes[0].IP_ADDRESS"]}),
        ["groups", 0, "commands", 1],
        "not closed",
    ),
    bad("reference-in-nodes-task", task(nodes=2, commands=[f"ping {REF}"]), ["commands", 0], "no `groups`"),
    bad(
        "secret-in-commands-rejected",
        two_groups(first={"commands": ["echo ${{ secrets.TOKEN }}"]}),
        ["groups", 0, "commands", 0],
        "can only be used in env values",
    ),
    bad(
        "other-namespace-rejected",
        two_groups(first={"commands": ["echo ${{ env.TOKEN }}"]}),
        ["groups", 0, "commands", 0],
        "not supported",
    ),
    bad(
        "reference-in-group-env",
        two_groups(second={"env": {"PEER": "${{ groups[5].nodes[0].IP_ADDRESS }}"}}),
        ["groups", 1, "env", "PEER"],
        "groups[5] does not exist",
    ),
    bad(
        "reference-in-top-env",
        two_groups(env=["PEER=${{ groups[0].nodes[1].IP_ADDRESS }}"]),
        ["env", "PEER"],
        "nodes[1] does not exist",
    ),
    # ---- env and image ---------------------------------------------------------------------
    bad("bare-env-without-value", task(env=["HF_TOKEN"]), ["env", "HF_TOKEN"], "create a secret"),
    bad(
        "bare-group-env-without-value",
        two_groups(first={"env": ["TOKEN"]}),
        ["groups", 0, "env", "TOKEN"],
        "`TOKEN` has no value",
    ),
    ok(
        "bare-env-from-secret",
        task(env=["HF_TOKEN"]),
        {"env.HF_TOKEN": "s3cret", "groups.0.env.HF_TOKEN": "s3cret"},
        secrets={"HF_TOKEN": "s3cret"},
    ),
    ok(
        "env-values-win-over-secrets",
        task(env={"HF_TOKEN": None}),
        {"env.HF_TOKEN": "passed"},
        env_values={"HF_TOKEN": "passed"},
        secrets={"HF_TOKEN": "stored"},
    ),
    ok(
        "group-env-wins",
        two_groups(first={"env": {"MODE": "router"}}, env=["MODE=all", "SHARED=1"]),
        {"groups.0.env": {"MODE": "router", "SHARED": "1"}, "groups.1.env": {"MODE": "all", "SHARED": "1"}},
    ),
    ok(
        "env-numbers-become-text",
        task(env={"PORT": 8000, "DEBUG": True}),
        {"env": {"PORT": "8000", "DEBUG": "true"}},
    ),
    bad("env-bad-name", task(env=["1BAD=x"]), ["env", 0], "not a valid variable name"),
    bad("env-set-twice", task(env=["A=1", "A=2"]), ["env", 1], "set twice"),
    ok(
        "group-image-overrides-top",
        two_groups(second={"image": "mine:1"}, image="base:1"),
        {"groups.0.image": "base:1", "groups.1.image": "mine:1", "image": "base:1"},
    ),
    ok(
        "ports-numbers-and-mappings",
        task(ports=[8000, "9000:9090", "7000"]),
        {"groups.0.ports": [8000, "9000:9090", 7000]},
    ),
    bad(
        "group-port-out-of-range",
        two_groups(first={"ports": [80, 70000]}),
        ["groups", 0, "ports", 1],
        "out of range",
    ),
    # ---- type dispatch, documents ----------------------------------------------------------
    bad("type-missing", {"nodes": 2}, ["type"], "`type` is required"),
    bad("type-unknown", {"type": "dev-environment"}, ["type"], "unknown type `dev-environment`"),
    bad("yaml-syntax-error", "type: task\ncommands:\n  - [unclosed\n", ["configuration"], "line 4, column 1"),
    bad("yaml-duplicate-key", "type: task\nnodes: 1\nnodes: 2\n", ["configuration"], "duplicate key `nodes`"),
    bad("top-level-list", "- type: task\n", ["configuration"], "mapping"),
    ok("json-text", '{"type": "task", "nodes": 3}', {"nodes": 3}),
    ok(
        "seed-style-yaml",
        yaml("""
        type: task
        name: pd-disagg
        groups:
          - name: router
            resources: {cpu: 4}
            commands: ["smg launch --prefill http://${{ groups[1].nodes[0].IP_ADDRESS }}:8000"]
          - name: prefill
            resources: {gpu: L40S}
        """),
        {"nodes": 2, "name": "pd-disagg", "groups.0.resources.cpu.min": 4},
    ),
]


@pytest.mark.parametrize(("doc", "kwargs", "expect", "loc", "phrase"), CASES)
def test_configuration_rule(
    doc: Any, kwargs: dict, expect: dict | None, loc: list | None, phrase: str | None
) -> None:
    check_rule(doc, kwargs, expect, loc, phrase)


def test_case_table_is_big_enough_to_cover_the_rules() -> None:
    assert len(CASES) + len(FLEET_CASES) >= 50
