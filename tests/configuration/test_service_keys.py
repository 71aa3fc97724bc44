"""`type: service`: every key of dstack 0.22.5's services with its type, default and rules, and the
task keys a service shares, one row each (what is written, what the parser makes of it)."""

from __future__ import annotations

from typing import Any

import pytest

from runs.configuration import ConfigurationError, parse_any_configuration
from runs.configuration.stored import StoredService, stored_run
from tests.configuration.rules import bad, check_rule, ok


def svc(**fields: Any) -> dict:
    return {"type": "service", "port": 8000, "commands": ["serve"], **fields}


def grouped(*groups: dict, **top: Any) -> dict:
    return {"type": "service", "port": 8000, "groups": list(groups), **top}


SCALED = {"metric": "rps", "target": 10}
CASES = [
    # ---- defaults --------------------------------------------------------------------------
    ok("defaults", svc(), {"type": "service", "port": 8000, "auth": True, "strip_prefix": True, "model": None,
                           "https": None, "groups.0.name": "0", "groups.0.replicas": {"min": 1, "max": 1},
                           "groups.0.scaling": None, "groups.0.nodes": 1, "groups.0.probes": [], "nodes": 1}),
    # ---- port ------------------------------------------------------------------------------
    bad("port-required", {"type": "service", "commands": ["x"]}, ["port"], "`port` is required"),
    ok("port-mapping-string", svc(port="80:8080"), {"port": 8080}),
    ok("port-mapping-object", svc(port={"local_port": 80, "container_port": 9000}), {"port": 9000}),
    bad("port-out-of-range", svc(port=70000), ["port"], "1 to 65535"),
    bad("port-not-a-number", svc(port=True), ["port"], "1 to 65535"),
    # ---- replicas and scaling ----------------------------------------------------------------
    ok("replicas-fixed", svc(replicas=3), {"groups.0.replicas": {"min": 3, "max": 3}, "nodes": 3}),
    ok("replicas-range", svc(replicas="1..4", scaling=SCALED),
       {"groups.0.replicas": {"min": 1, "max": 4}, "groups.0.scaling.target": 10.0,
        "groups.0.scaling.scale_up_delay": 300, "groups.0.scaling.scale_down_delay": 600,
        "groups.0.scaling.window": 60, "nodes": 1}),
    ok("replicas-range-to-zero", svc(replicas="..2", scaling=SCALED), {"groups.0.replicas": {"min": 0, "max": 2},
                                                                        "nodes": 0}),
    ok("replicas-object", svc(replicas={"min": 2, "max": 5}, scaling=SCALED), {"groups.0.replicas.max": 5}),
    ok("scaling-delays", svc(replicas="1..2", scaling={**SCALED, "scale_up_delay": "30s", "scale_down_delay": "1m",
                                                       "window": "5m"}),
       {"groups.0.scaling.scale_up_delay": 30, "groups.0.scaling.scale_down_delay": 60,
        "groups.0.scaling.window": 300}),
    bad("replicas-range-needs-scaling", svc(replicas="1..4"), ["scaling"], "needs `scaling`"),
    bad("fixed-replicas-with-scaling", svc(replicas=2, scaling=SCALED), ["replicas"], "to be a range"),
    bad("replicas-open-range", svc(replicas="2..", scaling=SCALED), ["replicas"], "maximum number of replicas"),
    bad("replicas-negative", svc(replicas=-1), ["replicas"], "cannot be negative"),
    bad("replicas-reversed", svc(replicas="4..1", scaling=SCALED), ["replicas"], "greater than its maximum"),
    bad("scaling-metric", svc(replicas="1..2", scaling={"metric": "qps", "target": 1}), ["scaling", "metric"],
        "metric must be rps"),
    bad("scaling-target-zero", svc(replicas="1..2", scaling={"metric": "rps", "target": 0}), ["scaling", "target"],
        "above 0"),
    bad("scaling-window", svc(replicas="1..2", scaling={**SCALED, "window": "2m"}), ["scaling", "window"],
        "30s, 60s, 300s"),
    bad("scaling-unknown-key", svc(replicas="1..2", scaling={**SCALED, "cooldown": 1}), ["scaling", "cooldown"],
        "unknown key"),
    # ---- auth, strip_prefix, https, gateway, model, rate_limits ------------------------------
    ok("auth-off", svc(auth=False, strip_prefix=False), {"auth": False, "strip_prefix": False}),
    bad("auth-not-bool", svc(auth="no"), ["auth"], "true or false"),
    ok("https-auto", svc(https="auto"), {"https": None}),
    bad("https-bad", svc(https="sometimes"), ["https"], "true, false or auto"),
    ok("gateway-false", svc(gateway=False), {"gateway": False}),
    ok("model-name", svc(model="meta-llama/Llama-3.1-8B"),
       {"model": "meta-llama/Llama-3.1-8B", "groups.0.probes.0.url": "/v1/chat/completions",
        "groups.0.probes.0.method": "post", "groups.0.probes.0.port": 8000}),
    ok("model-mapping-prefix", svc(model={"name": "m", "format": "openai", "prefix": "/api/v1/"}),
       {"model": "m", "groups.0.probes.0.url": "/api/v1/chat/completions"}),
    ok("model-tgi-no-default-probe", svc(model={"name": "m", "format": "tgi"}), {"groups.0.probes": []}),
    ok("model-with-probes-keeps-them", svc(model="m", probes=[{"type": "http", "url": "/health"}]),
       {"groups.0.probes.0.url": "/health", "groups.0.probes.0.port": 8000}),
    ok("model-with-empty-probes", svc(model="m", probes=[]), {"groups.0.probes": []}),
    bad("model-format", svc(model={"name": "m", "format": "grpc"}), ["model", "format"], "openai"),
    ok("rate-limits", svc(rate_limits=[{"prefix": "/v1", "rps": 5, "burst": 2},
                                       {"key": {"type": "header", "header": "X-User"}, "rps": 1}]),
       {"rate_limits.0.rps": 5.0, "rate_limits.1.key.header": "X-User"}),
    bad("rate-limit-duplicate-prefix", svc(rate_limits=[{"rps": 1}, {"rps": 2}]), ["rate_limits"],
        "used more than once"),
    bad("rate-limit-rps-missing", svc(rate_limits=[{"prefix": "/"}]), ["rate_limits", 0, "rps"], "required"),
    bad("rate-limit-header-missing", svc(rate_limits=[{"rps": 1, "key": {"type": "header"}}]),
        ["rate_limits", 0, "key"], "needs `header`"),
    # ---- probes ------------------------------------------------------------------------------
    ok("probe-defaults-to-the-service-port", svc(probes=[{"type": "http", "url": "/ready"}]),
       {"groups.0.probes.0.port": 8000, "groups.0.probes.0.interval": 15, "groups.0.probes.0.timeout": 10}),
    ok("probe-own-port", svc(probes=[{"type": "tcp", "port": 9000}]), {"groups.0.probes.0.port": 9000}),
    bad("probe-bad-url", svc(probes=[{"url": "health"}]), ["probes", 0, "url"], "starting with `/`"),
    # ---- task keys a service shares ----------------------------------------------------------
    ok("task-keys", svc(image="python:3.12", env={"A": "1"}, retry={"on_events": ["error"], "duration": "1h"},
                        max_duration="2h", fleets=["gpu"], resources={"gpu": "A100:1"}, privileged=True),
       {"image": "python:3.12", "env": {"A": "1"}, "retry.duration": 3600, "max_duration": 7200,
        "fleets": ["gpu"], "groups.0.resources.gpu.count.min": 1, "container.privileged": True}),
    bad("task-key-typo", svc(comands=["x"]), ["comands"], "unknown key"),
    ok("nodes-multi-host-replicas", svc(nodes=2, replicas=3), {"groups.0.nodes": 2, "nodes": 6}),
    bad("ports-refused", svc(ports=[8000]), ["ports"], "serves on `port`"),
    ok("startup-order-within-a-replica", svc(nodes=2, startup_order="workers-first"),
       {"startup_order": "workers-first"}),
    bad("on-failure-refused", svc(on_failure=[{"action": "fail-run"}]), ["on_failure"], "`retry`"),
    # ---- replica groups ------------------------------------------------------------------------
    ok("groups", grouped({"name": "router", "replicas": 1, "router": {"type": "sglang"}, "commands": ["r"]},
                         {"name": "worker", "count": "0..4", "scaling": SCALED, "commands": ["w"],
                          "env": {"ROLE": "w"}, "resources": {"cpu": 2}}),
       {"groups.0.name": "router", "groups.0.router": "smg", "groups.1.replicas": {"min": 0, "max": 4},
        "groups.1.env": {"ROLE": "w"}, "groups.1.scaling.metric": "rps", "nodes": 1}),
    ok("group-default-name", grouped({"replicas": 2, "commands": ["a"]}), {"groups.0.name": "0"}),
    ok("legacy-groups-under-replicas", {"type": "service", "port": 80, "replicas": [{"replicas": 2, "commands": ["a"]}]},
       {"groups.0.replicas": {"min": 2, "max": 2}}),
    ok("service-probes-apply-to-every-group", grouped({"replicas": 1, "commands": ["a"]},
                                                      {"replicas": 1, "commands": ["b"]}, probes=[{"url": "/h"}]),
       {"groups.1.probes.0.url": "/h", "groups.1.probes.0.port": 8000}),
    ok("model-probe-only-on-the-router", grouped(
        {"name": "r", "replicas": 1, "router": {"type": "smg"}, "commands": ["r"]},
        {"name": "w", "replicas": 2, "commands": ["w"]}, model="m"),
       {"groups.0.probes.0.url": "/v1/chat/completions", "groups.1.probes": []}),
    bad("group-replicas-required", grouped({"commands": ["a"]}), ["groups", 0, "replicas"], "needs `replicas`"),
    bad("group-range-needs-scaling", grouped({"replicas": "1..3", "commands": ["a"]}), ["groups", 0, "scaling"],
        "needs `scaling`"),
    bad("group-needs-commands-or-image", grouped({"replicas": 1}), ["groups", 0, "commands"], "needs `commands`"),
    ok("group-nodes", grouped({"replicas": 2, "nodes": 2, "commands": ["a"]}), {"groups.0.nodes": 2, "nodes": 4}),
    bad("group-nodes-at-least-1", grouped({"replicas": 1, "nodes": 0, "commands": ["a"]}), ["groups", 0, "nodes"],
        "at least 1"),
    bad("group-nodes-whole-number", grouped({"replicas": 1, "nodes": "two", "commands": ["a"]}),
        ["groups", 0, "nodes"], "whole number"),
    bad("group-nodes-not-on-the-router", grouped(
        {"name": "r", "replicas": 1, "router": {"type": "smg"}, "nodes": 2, "commands": ["r"]},
        {"name": "w", "replicas": 1, "nodes": 2, "commands": ["w"]}), ["groups", 0, "nodes"], "worker groups"),
    bad("nodes-at-the-top-with-groups", grouped({"replicas": 1, "commands": ["a"]}, nodes=2), ["nodes"],
        "in each group"),
    bad("group-name-rule", grouped({"name": "Web", "replicas": 1, "commands": ["a"]}), ["groups", 0, "name"],
        "not a valid group name"),
    bad("group-names-unique", grouped({"name": "a", "replicas": 1, "commands": ["a"]},
                                      {"name": "a", "replicas": 1, "commands": ["a"]}), ["groups", 1, "name"],
        "already used"),
    bad("groups-and-replicas", grouped({"replicas": 1, "commands": ["a"]}, replicas=2), ["replicas"],
        "cannot be used together"),
    bad("groups-and-top-scaling", grouped({"replicas": 1, "commands": ["a"]}, scaling=SCALED), ["scaling"],
        "in each group"),
    bad("groups-and-top-commands", grouped({"replicas": 1, "commands": ["a"]}, commands=["b"]), ["commands"],
        "cannot be used with `groups`"),
    bad("groups-empty", grouped(), ["groups"], "at least one"),
    bad("image-at-both-levels", grouped({"replicas": 1, "image": "b"}, image="a"), ["groups", 0, "image"],
        "one place only"),
    bad("two-routers", grouped({"replicas": 1, "router": {}, "commands": ["a"]},
                               {"replicas": 1, "router": {}, "commands": ["a"]}), ["groups", 1, "router"],
        "at most one"),
    bad("router-replicas", grouped({"replicas": 2, "router": {}, "commands": ["a"]}), ["groups", 0, "replicas"],
        "replicas: 1"),
    bad("router-type", grouped({"replicas": 1, "router": {"type": "nginx"}, "commands": ["a"]}),
        ["groups", 0, "router", "type"], "smg, dynamo"),
    # ---- worker (a PD worker group's role over what its replicas report) ---------------------
    ok("worker-prefill", grouped({"name": "r", "replicas": 1, "router": {}, "commands": ["r"]},
                                 {"name": "p", "replicas": 2, "worker": {"role": "prefill", "bootstrap_port": 8998},
                                  "commands": ["p"]}),
       {"groups.1.worker": {"role": "prefill", "bootstrap_port": 8998}, "groups.0.worker": None}),
    ok("worker-role-only", grouped({"replicas": 1, "worker": {"role": "decode"}, "commands": ["d"]}),
       {"groups.0.worker": {"role": "decode", "bootstrap_port": None}}),
    bad("worker-role", grouped({"replicas": 1, "worker": {"role": "encode"}, "commands": ["a"]}),
        ["groups", 0, "worker", "role"], "prefill, decode, regular"),
    bad("worker-bootstrap-port", grouped({"replicas": 1, "worker": {"role": "prefill", "bootstrap_port": 0},
                                          "commands": ["a"]}), ["groups", 0, "worker", "bootstrap_port"], "1 to 65535"),
    bad("worker-bootstrap-port-of-decode", grouped({"replicas": 1, "worker": {"role": "decode", "bootstrap_port": 9},
                                                    "commands": ["a"]}), ["groups", 0, "worker"], "role: prefill"),
    bad("worker-unknown-key", grouped({"replicas": 1, "worker": {"rol": "decode"}, "commands": ["a"]}),
        ["groups", 0, "worker", "rol"], ""),
    bad("worker-on-the-router", grouped({"replicas": 1, "router": {}, "worker": {"role": "decode"},
                                         "commands": ["a"]}), ["groups", 0, "worker"], "router group is no worker"),
    bad("group-unknown-key", grouped({"replicas": 1, "commands": ["a"], "gpus": 1}), ["groups", 0, "gpus"],
        "unknown key"),
]


@pytest.mark.parametrize(("doc", "kwargs", "expect", "loc", "phrase"), CASES)
def test_service_rule(doc: Any, kwargs: dict, expect: dict | None, loc: list | None, phrase: str | None) -> None:
    check_rule(doc, kwargs, expect, loc, phrase)


def _warnings(doc: dict, **kwargs: Any) -> dict[str, str]:
    return {w["field"]: w["message"] for w in parse_any_configuration(doc, **kwargs).warnings}


def test_keys_that_cannot_take_effect_say_why():
    found = _warnings(svc(gateway="my-gateway", https=True, rate_limits=[{"rps": 1}], model="m"))
    assert "no gateways" in found["gateway"]
    assert "plain HTTP" in found["https"] and "TLS proxy" in found["https"]
    assert "not enforced" in found["rate_limits"]
    assert "/proxy/models/" in found["model"]
    assert "only tasks are preempted" in _warnings(svc(preemptible=True))["preemptible"]
    assert "preemptible" not in _warnings(svc(preemptible=False))
    assert "https" not in _warnings(svc(https=True), endpoint_tls=True)
    assert _warnings(svc(gateway=False, https="auto")) == {}
    grouped_found = _warnings(grouped({"replicas": 1, "commands": ["a"], "router": {"type": "dynamo"},
                                       "python": "3.12", "spot_policy": "spot"}))
    assert "only smg" in grouped_found["groups[0].router"]
    assert not _warnings(grouped({"replicas": 1, "commands": ["a"], "router": {"type": "smg"}}))  # its list is kept
    assert {"groups[0].router", "groups[0].python", "groups[0].spot_policy"} <= set(grouped_found)


def test_all_problems_of_a_service_come_at_once():
    doc = {"type": "service", "port": 0, "replicas": "1..3", "commands": ["x"], "ports": [2], "comands": [],
           "probes": [{"url": "x"}], "groups": None}
    with pytest.raises(ConfigurationError) as raised:
        parse_any_configuration(doc)
    locs = {tuple(e["loc"]) for e in raised.value.errors}
    assert {("port",), ("ports",), ("comands",), ("probes", 0, "url")} <= locs


def test_the_checked_service_is_what_the_engine_reads_stored():
    conf = parse_any_configuration(grouped(
        {"name": "w", "replicas": "1..3", "scaling": {**SCALED, "scale_up_delay": "1m"}, "commands": ["w"],
         "worker": {"role": "prefill", "bootstrap_port": 9000}},
        {"name": "r", "replicas": 1, "router": {"type": "smg"}, "commands": ["r"]}, auth=False, model="m"))
    stored = stored_run(conf.model_dump(mode="json"))
    assert isinstance(stored, StoredService)
    assert (stored.port, stored.auth, stored.strip_prefix, stored.model) == (8000, False, True, "m")
    assert stored.replica_group("w").replicas.max == 3 and stored.replica_group("w").scaling.scale_up_delay == 60 \
        and stored.replica_group("w").scaling.window == 60
    assert stored.replica_group("r").router == "smg" and stored.replica_group("r").worker is None
    assert (stored.replica_group("w").worker.role, stored.replica_group("w").worker.bootstrap_port) == ("prefill", 9000)
    assert conf.desired_replicas() == {"w": 1, "r": 1}
