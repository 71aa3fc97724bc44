"""dstack's service examples (examples/deployment/*), planned through Muster's API unchanged: each
plans as dstack plans it (one replica of one host with the written resources, the OpenAI model's
default probe on the service's port) and every written key Muster does not act on has a warning."""

from __future__ import annotations

import pytest
import yaml

from tests.dstack_compat.test_dstack_examples import CONFIGS, _bare_env, _text

pytestmark = pytest.mark.django_db

# file -> the service's port
SERVICES = {"service-vllm.dstack.yml": 8000, "service-tgi.dstack.yml": 80, "service-nim.dstack.yml": 8000,
            "service-ollama.dstack.yml": 11434}
IMPLEMENTED = {"type", "name", "env", "commands", "resources", "port"}
IMPLEMENTED_WITH_IMAGE = {"image", "registry_auth"}


def test_every_vendored_service_example_is_planned_here():
    assert {p.name for p in CONFIGS.glob("service-*.dstack.yml")} == set(SERVICES)


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_a_dstack_service_example_plans_as_dstack_plans_it(api, name):
    text = _text(name)
    doc = yaml.safe_load(text)
    resp = api.post("/api/projects/main/runs/plan", {"configuration": text, "env": _bare_env(doc)}, format="json")
    assert resp.status_code == 200, resp.json()
    body = resp.json()
    assert [(j["job_num"], j["node_group_name"], j["replica_num"]) for j in body["jobs"]] == [(0, "0", 0)]
    assert body["replicas"] == {"0": {"min": 1, "max": 1, "desired": 1}}
    group = body["configuration"]["groups"][0]
    assert body["configuration"]["port"] == SERVICES[name]
    assert group["resources"]["gpu"]["memory"]["min"] == float(str(doc["resources"]["gpu"]).split("GB")[0])
    # dstack's default probe of an OpenAI model: a one-token chat completion on the service's port
    assert [(p["method"], p["url"], p["port"]) for p in group["probes"]] == [
        ("post", "/v1/chat/completions", SERVICES[name])]
    warned = {w["field"] for w in body["warnings"]}
    image = bool(doc.get("image"))
    for key in doc:
        if key not in IMPLEMENTED | (IMPLEMENTED_WITH_IMAGE if image else set()):
            assert key in warned, f"{key} is written, not implemented, and has no warning: {warned}"
