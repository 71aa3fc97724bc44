"""`scaling: {metric: queue}`: Muster's own metric (issue 41), one row per rule (what is written, what
the parser makes of it), and what the engine reads of it stored."""

from __future__ import annotations

from typing import Any

import pytest

from runs.configuration import parse_any_configuration
from runs.configuration.stored import StoredService, stored_run
from tests.configuration.rules import bad, check_rule, ok


def svc(**fields: Any) -> dict:
    return {"type": "service", "port": 8000, "commands": ["serve"], **fields}


QUEUE = {"metric": "queue", "target": 4, "queue_metric": "sglang:num_queue_reqs"}
CASES = [
    ok("queue-defaults", svc(replicas="1..4", scaling=QUEUE),
       {"groups.0.scaling.metric": "queue", "groups.0.scaling.target": 4.0,
        "groups.0.scaling.queue_metric": "sglang:num_queue_reqs", "groups.0.scaling.metrics_port": None,
        "groups.0.scaling.metrics_path": "/metrics", "groups.0.scaling.window": 60,
        "groups.0.scaling.scale_up_delay": 300, "groups.0.scaling.scale_down_delay": 600}),
    ok("queue-all-keys", svc(replicas="1..4", scaling={**QUEUE, "queue_metric": "vllm:num_requests_waiting",
                                                        "metrics_port": 9090, "metrics_path": "/prom/metrics",
                                                        "window": "5s", "scale_up_delay": "10s",
                                                        "scale_down_delay": "1m"}),
       {"groups.0.scaling.queue_metric": "vllm:num_requests_waiting", "groups.0.scaling.metrics_port": 9090,
        "groups.0.scaling.metrics_path": "/prom/metrics", "groups.0.scaling.window": 5,
        "groups.0.scaling.scale_up_delay": 10, "groups.0.scaling.scale_down_delay": 60}),
    ok("queue-in-a-group", {"type": "service", "port": 8000, "groups": [
        {"name": "router", "replicas": 1, "router": {"type": "smg"}, "commands": ["r"]},
        {"name": "decode", "replicas": "1..3", "scaling": QUEUE, "commands": ["d"]}]},
       {"groups.1.scaling.metric": "queue", "groups.0.scaling": None}),
    ok("rps-has-no-queue-keys", svc(replicas="1..4", scaling={"metric": "rps", "target": 2}),
       {"groups.0.scaling.metric": "rps", "groups.0.scaling.metrics_path": None,
        "groups.0.scaling.queue_metric": None}),
    bad("queue-without-queue-metric", svc(replicas="1..4", scaling={"metric": "queue", "target": 4}), ["scaling"],
        "metric: queue needs `queue_metric`"),
    bad("queue-metric-name", svc(replicas="1..4", scaling={**QUEUE, "queue_metric": "num queue{x}"}),
        ["scaling", "queue_metric"], "Prometheus metric name"),
    bad("queue-metrics-port-range", svc(replicas="1..4", scaling={**QUEUE, "metrics_port": 70000}),
        ["scaling", "metrics_port"], "1 to 65535"),
    bad("queue-metrics-port-text", svc(replicas="1..4", scaling={**QUEUE, "metrics_port": "metrics"}),
        ["scaling", "metrics_port"], "1 to 65535"),
    bad("queue-metrics-path", svc(replicas="1..4", scaling={**QUEUE, "metrics_path": "metrics"}),
        ["scaling", "metrics_path"], "starting with `/`"),
    # sent as the request line's bytes: only printable ASCII can be (an HTTP path is ASCII; %-escape the rest)
    bad("queue-metrics-path-not-ascii", svc(replicas="1..4", scaling={**QUEUE, "metrics_path": "/指标"}),
        ["scaling", "metrics_path"], "printable ASCII"),
    bad("queue-metrics-path-control", svc(replicas="1..4", scaling={**QUEUE, "metrics_path": "/m\x7f"}),
        ["scaling", "metrics_path"], "printable ASCII"),
    bad("queue-window-too-long", svc(replicas="1..4", scaling={**QUEUE, "window": "1h"}), ["scaling", "window"],
        "from 1s to 10m"),
    bad("queue-from-zero", svc(replicas="0..4", scaling=QUEUE), ["replicas"], "metric: queue needs at least 1"),
    bad("queue-target-zero", svc(replicas="1..4", scaling={**QUEUE, "target": 0}), ["scaling", "target"],
        "above 0"),
    bad("rps-with-queue-keys", svc(replicas="1..4", scaling={"metric": "rps", "target": 2, "metrics_port": 9090}),
        ["scaling"], "metrics_port is for metric: queue"),
    bad("metric-unknown", svc(replicas="1..4", scaling={"metric": "gpu", "target": 2}), ["scaling", "metric"],
        "metric must be rps (requests per second, as dstack) or queue"),
]


@pytest.mark.parametrize(("doc", "kwargs", "expect", "loc", "phrase"), CASES)
def test_queue_scaling_rule(doc, kwargs, expect, loc, phrase):
    check_rule(doc, kwargs, expect, loc, phrase)


def test_the_engine_reads_the_queue_keys_stored_and_an_rps_row_as_before():
    conf = parse_any_configuration(svc(replicas="1..4", scaling={**QUEUE, "metrics_port": 9090}))
    scaling = stored_run(conf.model_dump(mode="json")).groups[0].scaling
    assert (scaling.metric, scaling.queue_metric, scaling.metrics_port, scaling.metrics_path) == \
        ("queue", "sglang:num_queue_reqs", 9090, "/metrics")
    rps = stored_run(parse_any_configuration(svc(replicas="1..4", scaling={"metric": "rps", "target": 2}))
                     .model_dump(mode="json"))
    assert isinstance(rps, StoredService) and rps.groups[0].scaling.metrics_path == "/metrics"
    old_row = {"type": "service", "port": 80, "groups": [{"name": "0", "replicas": {"min": 1, "max": 2},
                                                         "scaling": {"metric": "rps", "target": 3}}]}
    assert stored_run(old_row).groups[0].scaling.queue_metric is None
