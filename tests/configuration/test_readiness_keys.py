"""`probes`, `ready_timeout` and `depends_on` through the plan API: defaults as dstack's service
probes have them, and every bad value named with its place, all in one 400, nothing created."""

from __future__ import annotations

import pytest

from runs.models import Run

pytestmark = pytest.mark.django_db


def plan(api, configuration):
    return api.post("/api/projects/main/runs/plan", {"configuration": configuration}, format="json")


def problems(resp) -> dict[str, str]:
    assert resp.status_code == 400, resp.json()
    return {".".join(str(p) for p in e["loc"]): e["msg"] for e in resp.json()["errors"]}


PD = """
type: task
name: pd
groups:
  - name: router
    depends_on: [decode, {group: loader, condition: done}]
    commands: [echo router]
  - name: decode
    ports: [8000]
    probes:
      - {url: /health, ready_after: 2}
      - {type: tcp, port: 5557}
      - {type: exec, command: [test, -f, /tmp/loaded]}
    ready_timeout: 20m
    commands: [echo decode]
  - name: loader
    commands: [echo loader]
"""


def test_probes_get_dstacks_defaults_and_the_groups_first_port(api):
    resp = plan(api, PD)
    assert resp.status_code == 200, resp.json()
    groups = resp.json()["configuration"]["groups"]
    http, tcp, exe = groups[1]["probes"]
    assert http == {"type": "http", "url": "/health", "method": "get", "headers": [], "body": None, "port": 8000,
                    "command": None, "interval": 15, "timeout": 10, "ready_after": 2, "until_ready": False}
    assert (tcp["type"], tcp["port"]) == ("tcp", 5557)
    assert (exe["command"], exe["port"]) == (["test", "-f", "/tmp/loaded"], None)
    assert groups[1]["ready_timeout"] == 1200
    assert groups[0]["ready_timeout"] == 1800, "the default ready_timeout is 30m"
    assert groups[0]["depends_on"] == [{"group": "decode", "condition": "ready"},
                                       {"group": "loader", "condition": "done"}]
    assert groups[2]["probes"] == [] and groups[2]["depends_on"] == []


def test_a_nodes_task_has_probes_at_the_top_level(api):
    conf = "type: task\nnodes: 2\nports: ['8080:9000']\nprobes: [{type: http}]\nready_timeout: 90s\ncommands: [x]\n"
    resp = plan(api, conf)
    assert resp.status_code == 200, resp.json()
    group = resp.json()["configuration"]["groups"][0]
    assert group["probes"][0]["port"] == 9000, "a local:container port probes the node's side"
    assert group["ready_timeout"] == 90


def test_every_bad_readiness_key_is_named_in_one_400_and_nothing_is_created(api):
    conf = """
type: task
probes: []
groups:
  - name: router
    depends_on: [decode, nope, router, {group: decode, condition: started}]
    commands: [echo]
  - name: decode
    probes:
      - {url: health, ready_after: 0, interval: 0s, timeout: 1h}
      - {type: tcp}
      - {type: exec}
      - {type: exec, command: [x], port: 3, url: /}
      - {type: http, port: 8000, command: [x]}
      - {type: grpc, port: 1}
      - {port: 8000, headers: [{name: "a b", value: v}]}
    ready_timeout: 31d
    depends_on: [loader]
    commands: [echo]
  - name: loader
    depends_on: [router]
    commands: [echo]
"""
    found = problems(plan(api, conf))
    expected = {
        "probes": "top-level `probes` cannot be used with `groups`",
        "groups.0.depends_on.1.group": "no group is named `nope`",
        "groups.0.depends_on.2.group": "cannot depend on itself",
        "groups.0.depends_on.3.condition": "",
        "groups.1.probes.0.url": "starting with `/`",
        "groups.1.probes.0.ready_after": "between 1 and 100",
        "groups.1.probes.0.interval": "between 1s and 3600s",
        "groups.1.probes.0.timeout": "between 1s and 300s",
        "groups.1.probes.1.port": "set `port`, or list the port",
        "groups.1.probes.2.command": "an exec probe needs `command`",
        "groups.1.probes.3.port": "an exec probe has `command`",
        "groups.1.probes.3.url": "an exec probe has `command`",
        "groups.1.probes.4.command": "`command` is for exec probes",
        "groups.1.probes.5.type": "",
        "groups.1.probes.6.headers.0.name": "not an HTTP header name",
        "groups.1.ready_timeout": "between 1s and",
        "groups.0.depends_on": "form a cycle: router -> decode -> loader -> router",
    }
    for loc, words in expected.items():
        assert loc in found and words in found[loc], (loc, found)
    assert not Run.objects.exists()


def test_depends_on_with_a_startup_order_is_a_400_on_each_group_that_has_it(api):
    conf = """
type: task
startup_order: workers-first
groups:
  - name: router
    depends_on: [workers]
    commands: [echo]
  - name: workers
    commands: [echo]
"""
    found = problems(plan(api, conf))
    assert list(found) == ["groups.0.depends_on"]
    assert "cannot be combined with startup_order: workers-first" in found["groups.0.depends_on"]


def test_depends_on_is_not_a_key_of_a_nodes_task(api):
    found = problems(plan(api, "type: task\nnodes: 2\ndepends_on: [default]\ncommands: [x]\n"))
    assert "unknown key `depends_on`" in found["depends_on"]
