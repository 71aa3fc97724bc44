"""serving/prometheus_text.py: a queue gauge read out of what a replica's /metrics answers, as SGLang
and vLLM write it, and out of answers that are odd or hostile."""

from __future__ import annotations

import time

import pytest

from serving.prometheus_text import MAX_LINE, gauge_value

SGLANG = """# HELP sglang:num_queue_reqs The number of requests in the waiting queue
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{engine_type="unified",model_name="qwen",pp_rank="0",tp_rank="0"} 7.0
# HELP sglang:num_running_reqs The number of running requests
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="unified",model_name="qwen",pp_rank="0",tp_rank="0"} 32.0
"""
VLLM = """# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B"} 3.0
vllm:num_requests_waiting{engine="1",model_name="meta-llama/Llama-3.1-8B"} 2.0
vllm:num_requests_waiting_total{engine="0"} 900.0
"""


@pytest.mark.parametrize("text, name, value", [
    (SGLANG, "sglang:num_queue_reqs", 7.0),
    (SGLANG, "sglang:num_running_reqs", 32.0),
    (VLLM, "vllm:num_requests_waiting", 5.0),  # one series per engine, summed; `_total` is another metric
    ("queue 4\n", "queue", 4.0),  # no labels
    ("queue 4 1712345678000\n", "queue", 4.0),  # a timestamp after the value
    ("queue\t2.5e1\n", "queue", 25.0),
    ("queue{a=\"x} 99\",b=\"say \\\"}\\\" 98\"} 3\n", "queue", 3.0),  # } and escaped quotes inside values
    ("queue{a=\"1\"} NaN\nqueue{a=\"2\"} 4\n", "queue", 4.0),  # NaN is no depth: that series left out
    ("queue NaN\n", "queue", None),
    ("queue +Inf\n", "queue", None),
    ("queue -3\n", "queue", None),
    ("queue{a=\"never closed 5\n", "queue", None),
    ("queue\n", "queue", None),
    ("queue many\n", "queue", None),
    ("# queue 5\n", "queue", None),  # a comment
    ("queue_depth 5\n", "queue", None),  # another metric that starts with the name
    ("other 5\n", "queue", None),
    ("", "queue", None),
    ("queue 1\r\nqueue{x=\"y\"} 2\r\n# EOF\r\n", "queue", 3.0),  # CRLF and OpenMetrics' end
])
def test_a_gauge_read_from_the_text_format(text, name, value):
    assert gauge_value(text, name) == value


def test_a_huge_line_is_skipped_and_a_huge_answer_read_quickly():
    assert gauge_value("queue{a=\"" + "x" * (MAX_LINE + 1) + "\"} 9\nqueue 1\n", "queue") == 1.0
    # a replica's worst within the size cap: many unclosed label sets and quotes
    hostile = ("queue{a=\"" + "\\\"" * 2000 + "\n") * 500 + "queue 2\n"
    started = time.monotonic()
    assert gauge_value(hostile, "queue") == 2.0
    assert time.monotonic() - started < 2
