"""tests/fake_tpu/ speaks queued resources as Google's REST v2 does, to the real tpu_v2 client."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from google.api_core import exceptions as gexc
from google.cloud import tpu_v2

from backends.gcp.tpu_client import TpuConfig, make_client

PARENT = "projects/p/locations/z1"


@pytest.fixture
def client(fake_tpu):
    return make_client(TpuConfig(project_id="p", zones=["z1"], api_endpoint=fake_tpu.endpoint, timeout=5))


def request(node_id: str, valid_seconds: int = 7200) -> tpu_v2.QueuedResource:
    Tpu = tpu_v2.QueuedResource.Tpu
    node = tpu_v2.Node(accelerator_type="v4-16", runtime_version="tpu-ubuntu2204-base")
    return tpu_v2.QueuedResource(
        tpu=Tpu(node_spec=[Tpu.NodeSpec(parent=PARENT, node_id=node_id, node=node)]),
        spot=tpu_v2.QueuedResource.Spot(),
        queueing_policy=tpu_v2.QueuedResource.QueueingPolicy(valid_until_duration=timedelta(seconds=valid_seconds)))


def test_a_queued_resource_goes_through_its_states_to_an_active_node_that_names_it(fake_tpu, client):
    fake_tpu.queued_script["z1"] = ["CREATING", "WAITING_FOR_RESOURCES", "PROVISIONING", "ACTIVE"]
    op = client.create_queued_resource(parent=PARENT, queued_resource=request("n1"), queued_resource_id="n1",
                                       timeout=5)
    assert op.operation.done
    name = f"{PARENT}/queuedResources/n1"
    seen = [client.get_queued_resource(name=name, timeout=5).state.state.name for _ in range(4)]
    assert seen == ["WAITING_FOR_RESOURCES", "PROVISIONING", "ACTIVE", "ACTIVE"]
    node = client.get_node(name=f"{PARENT}/nodes/n1", timeout=5)
    assert node.state.name == "READY" and node.queued_resource == name and len(node.network_endpoints) == 2
    assert [q.name for q in client.list_queued_resources(parent=PARENT, timeout=5)] == [name]


def test_a_duplicate_id_is_409_a_missing_one_404_and_delete_needs_force_while_nodes_exist(fake_tpu, client):
    fake_tpu.queued_script["z1"] = ["ACTIVE"]
    client.create_queued_resource(parent=PARENT, queued_resource=request("n1"), queued_resource_id="n1", timeout=5)
    with pytest.raises(gexc.Conflict):
        client.create_queued_resource(parent=PARENT, queued_resource=request("n1"), queued_resource_id="n1",
                                      timeout=5)
    with pytest.raises(gexc.NotFound):
        client.get_queued_resource(name=f"{PARENT}/queuedResources/nope", timeout=5)
    name = f"{PARENT}/queuedResources/n1"
    with pytest.raises(gexc.BadRequest):
        client.delete_queued_resource(name=name, timeout=5)
    client.delete_queued_resource(request={"name": name, "force": True}, timeout=5)
    assert fake_tpu.queued_delete_calls == [(name, False), (name, True)]
    assert fake_tpu.nodes == {} and fake_tpu.queued == {}


def test_failed_data_carries_the_error_and_valid_until_expires_a_waiting_request(fake_tpu, client):
    fake_tpu.queued_script["z1"] = ["CREATING", ("FAILED", 8, "no capacity")]
    client.create_queued_resource(parent=PARENT, queued_resource=request("n1"), queued_resource_id="n1", timeout=5)
    failed = client.get_queued_resource(name=f"{PARENT}/queuedResources/n1", timeout=5).state
    assert failed.state.name == "FAILED" and failed.failed_data.error.code == 8
    fake_tpu.queued_expire_zones = {"z1"}
    client.create_queued_resource(parent=PARENT, queued_resource=request("n2", 1), queued_resource_id="n2",
                                  timeout=5)
    name = f"{PARENT}/queuedResources/n2"
    assert client.get_queued_resource(name=name, timeout=5).state.state.name == "WAITING_FOR_RESOURCES"
    time.sleep(1.1)
    expired = client.get_queued_resource(name=name, timeout=5).state
    assert expired.state.name == "FAILED" and "expired" in expired.failed_data.error.message


def test_a_preempted_spot_slice_leaves_its_request_suspended(fake_tpu, client):
    fake_tpu.queued_script["z1"] = ["ACTIVE"]
    client.create_queued_resource(parent=PARENT, queued_resource=request("n1"), queued_resource_id="n1", timeout=5)
    fake_tpu.preempt(f"{PARENT}/nodes/n1")
    assert client.get_node(name=f"{PARENT}/nodes/n1", timeout=5).state.name == "PREEMPTED"
    state = client.get_queued_resource(name=f"{PARENT}/queuedResources/n1", timeout=5).state
    assert state.state.name == "SUSPENDED" and state.state_initiator.name == "SERVICE"
