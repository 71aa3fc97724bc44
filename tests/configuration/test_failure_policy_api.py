"""`on_failure` and `max_restarts` through the plan API: the shorthand and the rules come back
normalized, and every bad value is a 400 naming its field, all of them in one answer."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db

HEAD = """
type: task
groups:
  - name: head
    commands: [sleep 1]
"""


def plan(api, configuration: str):
    return api.post("/api/projects/main/runs/plan", {"configuration": configuration}, format="json")


def test_the_shorthand_and_the_rules_come_back_normalized_with_the_default_budget(api):
    resp = plan(api, HEAD + """
  - name: decode
    commands: [serve]
    on_failure: restart-group
  - name: prefill
    commands: [serve]
    max_restarts: 5
    on_failure:
      - {on_exit_codes: [42, 42, 3], action: restart-group}
      - {on_events: [interruption], action: restart-run}
      - {action: ignore}
""")
    assert resp.status_code == 200, resp.json()
    groups = resp.json()["configuration"]["groups"]
    assert groups[0]["on_failure"] == [] and groups[0]["max_restarts"] == 3
    assert groups[1]["on_failure"] == [{"on_events": ["error", "interruption"], "on_exit_codes": [],
                                        "action": "restart-group"}]
    assert groups[2]["max_restarts"] == 5
    assert groups[2]["on_failure"] == [
        {"on_events": ["error"], "on_exit_codes": [3, 42], "action": "restart-group"},
        {"on_events": ["interruption"], "on_exit_codes": [], "action": "restart-run"},
        {"on_events": ["error", "interruption"], "on_exit_codes": [], "action": "ignore"},
    ]


def test_every_bad_failure_key_is_named_in_one_400(api):
    resp = plan(api, """
type: task
groups:
  - name: head
    commands: [sleep 1]
    on_failure: ignore
  - name: a
    commands: [x]
    on_failure: restart-everything
    max_restarts: 1000
  - name: b
    commands: [x]
    on_failure:
      - {on_events: [interruption], on_exit_codes: [1], action: restart-group}
      - {on_events: [no-capacity], action: restart-group}
      - {on_exit_codes: [300], action: restart-group}
      - {on_events: [], action: ignore}
      - {action: restart-group, when: always}
""")
    assert resp.status_code == 400, resp.json()
    found = {tuple(e["loc"]): e["msg"] for e in resp.json()["errors"]}
    assert "holds rank 0" in found[("groups", 0, "on_failure", "action")]
    assert "restart-everything" in found[("groups", 1, "on_failure")]
    assert "0 to 100" in found[("groups", 1, "max_restarts")]
    assert "belong to `error`" in found[("groups", 2, "on_failure", 0, "on_exit_codes")]
    assert ("groups", 2, "on_failure", 1, "on_events", 0) in found
    assert "0..255" in found[("groups", 2, "on_failure", 2, "on_exit_codes")]
    assert "at least one event" in found[("groups", 2, "on_failure", 3, "on_events")]
    assert ("groups", 2, "on_failure", 4, "when") in found


def test_a_nodes_task_takes_the_keys_at_the_top_and_its_one_group_holds_rank_0(api):
    ok = plan(api, "type: task\nnodes: 2\ncommands: [x]\non_failure: restart-run\nmax_restarts: 1\n")
    assert ok.status_code == 200, ok.json()
    assert ok.json()["configuration"]["groups"][0]["max_restarts"] == 1
    bad = plan(api, "type: task\nnodes: 2\ncommands: [x]\non_failure: ignore\n")
    assert bad.status_code == 400
    assert [e["loc"] for e in bad.json()["errors"]] == [["on_failure", "action"]]


def test_with_groups_the_keys_are_per_group(api):
    resp = plan(api, "type: task\non_failure: restart-group\n" + HEAD.split("\n", 2)[2])
    assert resp.status_code == 400, resp.json()
    assert [e["loc"] for e in resp.json()["errors"]] == [["on_failure"]]
