"""Whatever a client posts to runs/plan, the answer is a plan (200) or a list of errors (400), never a 500."""

from __future__ import annotations

import json

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzzing import examples

pytestmark = pytest.mark.django_db

PLAN = "/api/projects/main/runs/plan"

KEYS = [
    "type", "name", "nodes", "groups", "commands", "resources", "gpu", "cpu", "memory", "disk", "env", "retry",
    "startup_order", "stop_criteria", "max_duration", "fleets", "image", "ports", "on_events", "duration",
    "count", "vendor", "configuration",
]  # fmt: skip
WORDS = [
    "task", "fleet", "L40S", "A100:80GB:8", "24GB:1..2", "amd:MI300X:8", "GB200", "tpu-v2-32", "v5litepod-16",
    "tpu:v6e-8", "v2-12", "tpu", "arm:8", "x86:4..", "2..8", "8..2", "..", "16GB..", "..64GB", "1h30m", "90s",
    "off", "any", "master-first", "workers-first", "all-done", "master-done", "no-capacity", "error",
    "interruption", "router", "prefill", "default", "Bad Name", "HF_TOKEN", "MISSING_KEY", "A=1", "1BAD=x",
    "8000", "8000:8080", "70000", "-1", "0", "",
]  # fmt: skip
FRAGMENTS = [
    "${{ groups[0].nodes[0].IP_ADDRESS }}", "${{groups[1].nodes[0].IP_ADDRESS}}",
    "${{ groups[9].nodes[0].IP_ADDRESS }}", "${{ groups[0].nodes[99].IP_ADDRESS }}",
    "${{ groups[0].nodes[0].HOSTNAME }}", "${{ groups[0].nodes[0] }}", "${{ env.HOME }}", "${{ oops",
    "$${{ literal }}", "${{}}", "${{ groups[-1].nodes[0].IP_ADDRESS }}", "}}",
]  # fmt: skip

texts = st.one_of(
    st.sampled_from(WORDS),
    st.sampled_from(FRAGMENTS),
    st.builds(lambda a, b, c: f"{a} {b}{c}", st.sampled_from(WORDS), st.sampled_from(FRAGMENTS), st.text(max_size=8)),
    st.text(max_size=16),
)
# JSON has no NaN, infinity or dates: the JSON body only carries what JSON can say.
json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(10**20), max_value=10**20),
    st.floats(allow_nan=False, allow_infinity=False), texts,
)
json_keys = st.one_of(st.sampled_from(KEYS), st.text(max_size=6))
json_values = st.recursive(
    json_scalars,
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(json_keys, children, max_size=5)),
    max_leaves=25,
)
resources = st.fixed_dictionaries(
    {}, optional={k: st.one_of(st.sampled_from(WORDS), json_scalars, json_values) for k in ("cpu", "memory", "disk", "gpu")}
)
group = st.fixed_dictionaries(
    {"name": st.sampled_from(["router", "prefill", "decode", "Bad", "router"])},
    optional={
        "nodes": st.one_of(st.integers(-1, 6), json_scalars),
        "resources": st.one_of(resources, json_values),
        "commands": st.lists(texts, max_size=3),
        "env": st.one_of(st.lists(texts, max_size=3), st.dictionaries(json_keys, json_scalars, max_size=3)),
        "image": json_scalars,
        "ports": json_values,
        "bogus": json_scalars,
    },
)
task = st.fixed_dictionaries(
    {"type": st.sampled_from(["task"] * 8 + ["fleet", "service"])},
    optional={
        "name": st.one_of(st.sampled_from(["pd", "run-1", "tpu-hello"]), texts),
        "nodes": st.one_of(st.integers(-1, 10), st.integers(-1, 10), json_scalars),
        "groups": st.one_of(st.lists(group, max_size=4), json_values),
        "commands": st.one_of(st.lists(texts, max_size=3), json_values),
        "resources": st.one_of(resources, json_values),
        "gpu": json_values,  # a resource key at the wrong level
        "env": st.one_of(st.lists(texts, max_size=3), json_values),
        "retry": st.one_of(st.booleans(), st.fixed_dictionaries(
            {}, optional={"on_events": st.lists(st.sampled_from(WORDS), max_size=3), "duration": json_scalars}),
            json_values),
        "startup_order": st.one_of(st.sampled_from(WORDS), json_values),
        "stop_criteria": st.one_of(st.sampled_from(WORDS), json_values),
        "max_duration": json_scalars,
        "fleets": json_values,
        "ports": json_values,
    },
)
configurations = st.one_of(task, st.dictionaries(json_keys, json_values, max_size=6), json_values)


def _to_yaml(document: object) -> str:
    return yaml.safe_dump(document, allow_unicode=True)


# Any text at all, and text put together from lines that look like a configuration.
raw_texts = st.one_of(
    st.text(max_size=200),
    st.lists(st.sampled_from(["type: task", "nodes: 2", "commands:", "  - echo hi", "- ]", "groups: [", "  x: {",
                              "env: [HF_TOKEN]", "resources: {gpu: tpu-v2-32}", "\t", "&a [*a]", "!!python/int 3",
                              "name: x", "name: x", "  - name: router", "    nodes: 2"]),
             max_size=8).map("\n".join),
)
env_field = st.one_of(
    st.dictionaries(st.sampled_from(["HF_TOKEN", "MISSING_KEY", "", "1X"]), st.text(max_size=5), max_size=2),
    json_values,
)
# Most bodies are well-formed requests whose configuration is task-shaped, so the fuzzing reaches the
# per-group rules, references and TPU expansion; the rest is junk at every level of the request.
bodies = st.one_of(
    st.fixed_dictionaries({"configuration": task, "env": st.just({"HF_TOKEN": "x"})}),
    st.fixed_dictionaries({"configuration": task.map(_to_yaml), "env": st.just({"HF_TOKEN": "x"})}),
    st.fixed_dictionaries({"configuration": task}),
    st.fixed_dictionaries({"configuration": st.one_of(configurations, raw_texts)}, optional={"env": env_field}),
    st.fixed_dictionaries({"configuration": configurations}, optional={"bogus": json_scalars}),
    json_values,  # not even an object
)


def _check(resp) -> None:
    assert resp.status_code in (200, 400), (resp.status_code, resp.content[:500])
    body = resp.json()
    if resp.status_code == 200:
        assert isinstance(body["jobs"], list) and body["jobs"]
        assert [j["job_num"] for j in body["jobs"]] == list(range(len(body["jobs"])))
        return
    assert set(body) == {"errors"}, body
    assert isinstance(body["errors"], list) and body["errors"], body
    for error in body["errors"]:
        assert set(error) == {"loc", "msg"}, error
        assert isinstance(error["loc"], list), error
        assert all(isinstance(p, str | int) and not isinstance(p, bool) for p in error["loc"]), error
        assert isinstance(error["msg"], str) and error["msg"].strip(), error


@settings(max_examples=examples(300), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(body=bodies)
def test_random_plan_bodies_get_a_plan_or_located_errors_never_a_500(api, body):
    # `api` is built once for the whole test; planning writes nothing, so examples cannot disturb each other.
    _check(api.post(PLAN, body, format="json"))


@settings(max_examples=examples(300), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(text=st.one_of(raw_texts, configurations.map(_to_yaml), st.binary(max_size=64).map(lambda b: b.decode("latin-1"))))
def test_random_configuration_text_sent_as_a_raw_json_string_never_500s(api, text):
    # The whole body is `{"configuration": "<text>"}`, built by hand, exactly as curl would send it.
    resp = api.generic("POST", PLAN, json.dumps({"configuration": text}), content_type="application/json")
    _check(resp)


def test_plan_answers_a_valid_body_with_jobs_and_a_bad_reference_with_its_location(api):
    """Anchors for the properties above: both answers they accept are reachable and look as checked."""
    good = api.post(PLAN, {"configuration": {"type": "task", "nodes": 2, "commands": ["echo"]}}, format="json")
    _check(good)
    assert good.status_code == 200 and len(good.json()["jobs"]) == 2
    bad = api.post(PLAN, {"configuration": "type: task\nnodes: 2\ncommands:\n  - echo ${{ oops }}\n"}, format="json")
    _check(bad)
    assert bad.status_code == 400
    assert bad.json()["errors"][0]["loc"] == ["commands", 0]
