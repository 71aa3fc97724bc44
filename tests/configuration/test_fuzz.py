"""Whatever a client sends, the parser answers with a configuration or a ConfigurationError."""

from __future__ import annotations

import datetime as dt

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runs.configuration import ConfigurationError, parse_any_configuration
from tests.fuzzing import examples

KEYS = [
    "type", "name", "nodes", "groups", "image", "env", "commands", "ports", "resources", "startup_order",
    "stop_criteria", "retry", "max_duration", "fleets", "cpu", "memory", "disk", "gpu", "vendor", "count",
    "on_events", "duration", "placement", "ssh_config", "hosts", "hostname", "user", "port", "private_key",
    "identity_file", "backends", "spot", "zones", "regions", "idle_duration", "runtime_version", "bogus",
]  # fmt: skip
WORDS = [
    "task", "fleet", "L40S", "MI300X", "GB200", "tpu-v2-32", "v2-12", "tpu:v6e-8", "amd:MI300X:8", "24GB:1..2",
    "arm:8", "2..8", "..64GB", "16GB..", "1h30m", "off", "master-first", "workers-first", "all-done", "cluster",
    "gcp", "local", "HF_TOKEN", "A=1", "8000:8080", "router", "Bad Name", "${{ groups[0].nodes[0].IP_ADDRESS }}",
    "${{ groups[9].nodes[0].IP_ADDRESS }}", "${{ groups[0].nodes[0] }}", "${{ oops", "$${{ x }}", "no-capacity",
    "", "..", "-1", "10.0.0.1",
]  # fmt: skip

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**20), max_value=10**20),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(WORDS),
    st.text(max_size=12),
    st.dates(min_value=dt.date(2000, 1, 1), max_value=dt.date(2030, 1, 1)),
)
keys = st.one_of(st.sampled_from(KEYS), st.text(max_size=6), st.integers(-3, 3), st.none())
values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(keys, children, max_size=5),
    ),
    max_leaves=25,
)
# Shapes close to real configurations, so the fuzzing reaches the per-group rules too.
resources = st.fixed_dictionaries(
    {}, optional={k: st.one_of(scalars, values) for k in ("cpu", "memory", "disk", "gpu")}
)
group = st.fixed_dictionaries(
    {"name": st.sampled_from(["router", "prefill", "decode", "Bad", "router"])},
    optional={
        "nodes": st.one_of(st.integers(-1, 6), scalars),
        "resources": st.one_of(resources, values),
        "commands": st.lists(st.one_of(st.sampled_from(WORDS), scalars), max_size=3),
        "env": values,
        "image": scalars,
        "ports": values,
    },
)
task = st.fixed_dictionaries(
    {"type": st.just("task")},
    optional={
        "groups": st.lists(group, max_size=4),
        "nodes": st.one_of(st.integers(-1, 100), scalars),
        "resources": resources,
        "env": st.one_of(st.lists(st.sampled_from(WORDS), max_size=3), values),
        "retry": values,
        "max_duration": scalars,
        "commands": st.lists(st.sampled_from(WORDS), max_size=3),
    },
)
documents = st.one_of(
    st.dictionaries(keys, values, max_size=8),
    st.fixed_dictionaries(
        {"type": st.sampled_from(["task", "fleet"])},
        optional={k: values for k in KEYS[1:]},
    ),
    task,
)


def _assert_answers_cleanly(data: object) -> None:
    try:
        parse_any_configuration(data, env_values={"HF_TOKEN": "x"}, max_nodes=64)  # type: ignore[arg-type]
    except ConfigurationError as exc:
        assert exc.errors
        for error in exc.errors:
            assert isinstance(error["loc"], list)
            assert all(isinstance(p, str | int) and not isinstance(p, bool) for p in error["loc"])
            assert isinstance(error["msg"], str) and error["msg"]


@settings(max_examples=examples(2000), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents)
def test_random_documents_either_parse_or_raise_configuration_errors(document: dict) -> None:
    _assert_answers_cleanly(document)


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents)
def test_random_documents_sent_as_yaml_text_behave_the_same(document: dict) -> None:
    try:
        text = yaml.safe_dump(document)
    except yaml.YAMLError:
        return
    _assert_answers_cleanly(text)


@settings(max_examples=examples(200), deadline=None)
@given(st.text(max_size=200))
def test_random_text_never_crashes_the_parser(text: str) -> None:
    _assert_answers_cleanly(text)
