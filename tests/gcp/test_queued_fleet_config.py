"""The fleet keys of queued TPU slices through the fleets API: what takes effect, and each bad use
a 400 naming the field and the fix, with no fleet created."""

from __future__ import annotations

import pytest
import yaml

from backends.gcp.tpu_client import TpuConfig
from backends.registry import fleet_backend_config
from instances.models import Fleet
from tests.conftest import example

pytestmark = pytest.mark.django_db


def apply(api, **changes):
    conf = {**yaml.safe_load(example("tpu-queued-spot-fleet.yml")), **changes}
    conf = {k: v for k, v in conf.items() if v is not None}
    return api.post("/api/projects/main/fleets/", {"configuration": conf}, format="json")


def errors(resp) -> dict[str, str]:
    assert resp.status_code == 400, resp.json()
    assert not Fleet.objects.exists(), "nothing half-created"
    return {".".join(map(str, e["loc"])): e["msg"] for e in resp.json()["errors"]}


def test_the_queued_spot_example_asks_for_spot_queued_slices_with_valid_until_and_a_reservation(api, settings):
    settings.MUSTER = {**settings.MUSTER, "GCP": {"project_id": "p", "api_endpoint": "http://127.0.0.1:9"}}
    resp = apply(api, reservation="r1")

    assert resp.status_code == 201, resp.json()
    assert "reservation" not in {w["field"] for w in resp.json().get("warnings", [])}
    cfg = TpuConfig.from_dict(fleet_backend_config(Fleet.objects.get()))
    assert (cfg.queued, cfg.valid_until, cfg.spot, cfg.reservation) == (True, 7200, True, "r1")


def test_spot_true_stays_an_alias_of_spot_policy_spot(api, settings):
    settings.MUSTER = {**settings.MUSTER, "GCP": {"project_id": "p", "api_endpoint": "http://127.0.0.1:9"}}
    assert apply(api, spot_policy=None, spot=True, queued_resource=True).status_code == 201
    cfg = TpuConfig.from_dict(fleet_backend_config(Fleet.objects.get()))
    assert (cfg.queued, cfg.valid_until, cfg.spot) == (True, None, True)


def test_queued_resource_on_an_ssh_fleet_is_a_400_that_says_to_remove_it(api):
    conf = {"type": "fleet", "name": "hosts", "ssh_config": {"user": "root", "hosts": ["10.0.0.5"]},
            "queued_resource": True}
    resp = api.post("/api/projects/main/fleets/", {"configuration": conf}, format="json")
    said = errors(resp)
    assert "queued_resource" in said and "gcp fleets" in said["queued_resource"]
    assert "remove it" in said["queued_resource"]


def test_queued_resource_on_a_local_fleet_is_a_400(api):
    resp = apply(api, backends=["local"], zones=None, spot_policy=None)
    assert "gcp fleets" in errors(resp)["queued_resource"]


@pytest.mark.parametrize("valid_until", ["31d", "0s"])
def test_a_valid_until_outside_what_google_queues_for_is_a_400_naming_the_limit(api, valid_until):
    said = errors(apply(api, queued_resource={"valid_until": valid_until}))
    [(field, message)] = said.items()
    assert field.startswith("queued_resource") and "at most 30d" in message


def test_a_malformed_queued_resource_or_reservation_is_a_400_with_the_shape_to_write(api):
    said = errors(apply(api, queued_resource={"valid_for": "2h"}, reservation="projects/p/bad"))
    assert "valid_until" in said[next(k for k in said if k.startswith("queued_resource"))]
    assert "projects/PROJECT/locations/ZONE/reservations/NAME" in said["reservation"]
