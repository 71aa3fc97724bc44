"""The PD service examples plan through the API as written: three replica groups, the router
group the one routed to, no warning about the router (its worker list is kept)."""

from __future__ import annotations

import pytest

from tests.conftest import example

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("name", ["pd-disagg-service.yml", "pd-disagg-local-service.yml"])
def test_the_pd_service_examples_plan(api, name):
    resp = api.post("/api/projects/main/runs/plan", {"configuration": example(name), "env": {"HF_TOKEN": "hf_x"}},
                    format="json")
    assert resp.status_code == 200, resp.json()
    body = resp.json()
    assert set(body["replicas"]) == {"router", "prefill", "decode"}
    assert not [w for w in body["warnings"] if "router" in str(w)], body["warnings"]
    groups = {g["name"]: g for g in body["configuration"]["groups"]}
    assert groups["router"]["router"] == "smg" and groups["prefill"]["router"] is None
