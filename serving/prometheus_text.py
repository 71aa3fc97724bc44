"""One gauge's value out of a replica's Prometheus text exposition (what `/metrics` answers).

The scaler (engine/replicas/queue_depth.py) reads a queue gauge this way, e.g. SGLang's
`sglang:num_queue_reqs` or vLLM's `vllm:num_requests_waiting`. The answer is the replica's and so
untrusted: it is read line by line without regular expressions that could backtrack, a line longer
than MAX_LINE is skipped, and only the named metric's samples are looked at. Its series (one per
label set: vLLM has one per engine, SGLang one per data-parallel rank) are summed: the replica's
queue is all of them. A sample that is not a finite number of at least 0 (NaN, +Inf, a negative
count) is no queue depth and is left out; a metric with no usable sample has no value (None).
Comments (`# HELP`, `# TYPE`, OpenMetrics' `# EOF`) and other metrics are skipped; a timestamp
after the value is ignored.
"""

from __future__ import annotations

import math

MAX_LINE = 64 * 1024


def gauge_value(text: str, name: str) -> float | None:
    """The sum of `name`'s finite, non-negative samples in `text`; None when it has none."""
    total, found = 0.0, False
    for line in text.splitlines():
        if len(line) > MAX_LINE or not line.startswith(name):
            continue
        value = _sample_value(line, name)
        if value is not None:
            total, found = total + value, True
    return total if found else None


def _sample_value(line: str, name: str) -> float | None:
    rest = line[len(name):]
    if rest.startswith("{"):
        end = _labels_end(rest)
        if end is None:
            return None
        rest = rest[end:]
    elif rest[:1] not in (" ", "\t"):
        return None  # another metric whose name starts with this one's (`..._total`, `..._bucket`)
    fields = rest.split()
    if not fields:
        return None
    try:
        value = float(fields[0])
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def _labels_end(rest: str) -> int | None:
    """The index just past the label set `{...}` that `rest` starts with (a `}` or `\\"` inside a
    quoted label value does not end it); None when it never closes."""
    quoted = escaped = False
    for i, char in enumerate(rest):
        if escaped:
            escaped = False
        elif quoted and char == "\\":
            escaped = True
        elif char == '"':
            quoted = not quoted
        elif char == "}" and not quoted:
            return i + 1
    return None
