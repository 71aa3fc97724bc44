# ruff: noqa: F811 - pytest injects the imported fake_tpu fixture by parameter name
"""The gcp backend driven through the real google-cloud-tpu client against the loopback fake API."""

from __future__ import annotations

import socket
import threading
import time
from http import HTTPStatus

import pytest

from backends.base import BackendError, NoCapacityError
from backends.gcp import tpu_client, tpu_create, tpu_errors, tpu_nodes, tpu_offers
from backends.gcp.compute import GcpTpuCompute
from backends.gcp.tpu_shapes import FAMILIES
from tests.fake_tpu import fake_tpu  # noqa: F401
from tests.waiting import wait_until

PROJECT = "muster-test"
NODE = "projects/muster-test/locations/{zone}/nodes/{node}"


def make_compute(server, zones=("us-central2-b",), **extra) -> GcpTpuCompute:
    return GcpTpuCompute(
        {"project_id": PROJECT, "zones": list(zones), "api_endpoint": server.endpoint, "timeout": 5, **extra}
    )


def tpu_offer(compute: GcpTpuCompute, slice_name: str):
    [offer] = compute.get_offers({"gpu": {"tpu": slice_name}})
    return offer


def test_v2_32_is_creating_first_then_ready_with_four_hosts_in_worker_order(fake_tpu):
    compute = make_compute(fake_tpu, spot=True)
    offer = tpu_offer(compute, "v2-32")

    assert compute.create_instances(offer, 4, ["pod-a"]) == []
    assert compute.update_provisioning_data("pod-a", {}) is None
    records = compute.update_provisioning_data("pod-a", {})

    assert [r.worker_index for r in records] == [0, 1, 2, 3]
    assert [r.internal_ip for r in records] == ["10.200.0.2", "10.200.0.3", "10.200.0.4", "10.200.0.5"]
    assert [r.hostname for r in records] == [r.internal_ip for r in records]
    name = NODE.format(zone="us-central2-b", node="pod-a")
    assert {r.region for r in records} == {"us-central2-b"}
    assert all(r.backend_data == {"zone": "us-central2-b", "node_name": name} for r in records)
    assert records[0].resources["tpu_chips"] == 4 and records[0].resources["tpu"] == "v2-32"
    node = fake_tpu.node(name)
    assert node.accelerator_type == "v2-32"
    assert node.runtime_version == FAMILIES["v2"].default_runtime_version
    assert node.scheduling_config.spot is True
    assert node.network_config.network == f"projects/{PROJECT}/global/networks/default"
    assert node.labels["muster-group"] == "pod-a"
    assert fake_tpu.create_calls == [name]


def test_exhausted_first_zone_falls_back_to_the_second_with_one_create_per_zone(fake_tpu):
    fake_tpu.exhausted_zones = {"zone-a"}
    compute = make_compute(fake_tpu, zones=["zone-a", "zone-b", "zone-c"])

    compute.create_instances(tpu_offer(compute, "v2-32"), 4, ["pod-b"])

    assert fake_tpu.create_calls == [
        NODE.format(zone="zone-a", node="pod-b"),
        NODE.format(zone="zone-b", node="pod-b"),
    ]
    assert fake_tpu.node(NODE.format(zone="zone-b", node="pod-b")) is not None
    compute.update_provisioning_data("pod-b", {})
    [first, *_] = compute.update_provisioning_data("pod-b", {})
    assert first.region == "zone-b"


def test_every_zone_exhausted_raises_no_capacity_after_one_create_per_zone(fake_tpu):
    fake_tpu.exhausted_zones = {"zone-a", "zone-b"}
    compute = make_compute(fake_tpu, zones=["zone-a", "zone-b"])

    with pytest.raises(NoCapacityError):
        compute.create_instances(tpu_offer(compute, "v4-16"), 2, ["pod-c"])

    assert len(fake_tpu.create_calls) == 2
    assert fake_tpu.nodes == {}


def test_unavailable_zone_is_asked_again_by_the_same_id_and_never_skipped(fake_tpu):
    # A 503 does not say the create was not taken: trying zone-b could make a second slice.
    fake_tpu.unavailable_zones = {"zone-a"}
    cfg = tpu_client.TpuConfig(PROJECT, ["zone-a", "zone-b"], api_endpoint=fake_tpu.endpoint, timeout=0.5)
    client = tpu_client.make_client(cfg)

    created = tpu_create.create_slice(client, cfg, "pod-d", "v2-8", {})
    fake_tpu.unavailable_zones = set()
    assert created.zone == "zone-a" and created.status is None

    def advance():
        nonlocal created
        created = tpu_create.advance_slice(client, cfg, "pod-d", "v2-8", {}, created.state)
        return created.status and created.status.state == "READY"

    wait_until(advance, 20, "the slice created in zone-a after the 503")
    assert fake_tpu.create_calls == [NODE.format(zone="zone-a", node="pod-d")] * 2
    assert list(fake_tpu.nodes) == [NODE.format(zone="zone-a", node="pod-d")]


def test_creating_again_returns_the_existing_slice_even_when_an_earlier_zone_has_capacity_now(fake_tpu):
    fake_tpu.exhausted_zones = {"zone-a"}
    cfg = tpu_client.TpuConfig(PROJECT, ["zone-a", "zone-b"], api_endpoint=fake_tpu.endpoint, timeout=5)
    client = tpu_client.make_client(cfg)
    first = tpu_create.create_slice(client, cfg, "pod-e", "v2-32", {})
    fake_tpu.exhausted_zones = set()

    again = tpu_create.create_slice(client, cfg, "pod-e", "v2-32", {})

    assert again.zone == first.zone == "zone-b"
    assert again.node_name == first.node_name
    assert len(fake_tpu.create_calls) == 2  # the retry looked the node up instead of creating it
    assert list(fake_tpu.nodes) == [first.node_name]


def test_already_exists_from_a_racing_create_counts_as_success_in_that_zone(fake_tpu, monkeypatch):
    cfg = tpu_client.TpuConfig(PROJECT, ["zone-a"], api_endpoint=fake_tpu.endpoint, timeout=5)
    client = tpu_client.make_client(cfg)
    tpu_create.create_slice(client, cfg, "pod-f", "v2-8", {})
    monkeypatch.setattr(tpu_create, "find_slice", lambda *a: None)  # the other attempt won after our look-up

    created = tpu_create.create_slice(client, cfg, "pod-f", "v2-8", {})

    assert (created.zone, created.node_name) == ("zone-a", NODE.format(zone="zone-a", node="pod-f"))
    assert len(fake_tpu.create_calls) == 2 and len(fake_tpu.nodes) == 1


def test_terminating_a_group_deletes_the_slice_with_exactly_one_call(fake_tpu):
    compute = make_compute(fake_tpu)
    compute.create_instances(tpu_offer(compute, "v2-8"), 1, ["pod-g"])
    name = NODE.format(zone="us-central2-b", node="pod-g")

    compute.terminate_group("pod-g", {"zone": "us-central2-b", "node_name": name})

    assert fake_tpu.delete_calls == [name]
    assert tpu_nodes.get_slice(compute.client, compute.tpu, name) is None
    with pytest.raises(BackendError, match="no longer exists"):
        compute.update_provisioning_data("pod-g", {"node_name": name})


def test_terminating_one_host_deletes_its_whole_slice(fake_tpu):
    fake_tpu.creation_polls = 0
    compute = make_compute(fake_tpu)
    records = compute.create_instances(tpu_offer(compute, "v2-32"), 4, ["pod-h"])

    compute.terminate("pod-h-2", records[2].backend_data)

    assert fake_tpu.delete_calls == [records[2].backend_data["node_name"]]
    assert fake_tpu.nodes == {}


def test_deleting_an_unknown_slice_is_success(fake_tpu):
    compute = make_compute(fake_tpu)
    name = NODE.format(zone="us-central2-b", node="never-made")

    compute.terminate_group("never-made", {"node_name": name})
    compute.terminate_group("never-made", {})  # no zone recorded: looked up, nothing to delete

    assert fake_tpu.delete_calls == [name]


def test_single_host_slice_ready_at_once_comes_back_from_the_create_call(fake_tpu):
    fake_tpu.creation_polls = 0
    compute = make_compute(fake_tpu)

    records = compute.create_instances(tpu_offer(compute, "v4-8"), 1, ["pod-i"])

    assert len(records) == 1
    assert records[0].worker_index == 0 and records[0].internal_ip == "10.200.0.2"
    assert [m for m, _ in fake_tpu.calls].count("POST") == 1


def test_stuck_slice_keeps_reporting_not_ready(fake_tpu):
    fake_tpu.stuck_creating = True
    compute = make_compute(fake_tpu)
    compute.create_instances(tpu_offer(compute, "v2-32"), 4, ["pod-j"])
    name = NODE.format(zone="us-central2-b", node="pod-j")

    for _ in range(5):
        assert compute.update_provisioning_data("pod-j", {"node_name": name}) is None


def test_preempted_slice_is_a_backend_error(fake_tpu):
    fake_tpu.creation_polls = 0
    compute = make_compute(fake_tpu)
    compute.create_instances(tpu_offer(compute, "v2-8"), 1, ["pod-k"])
    name = NODE.format(zone="us-central2-b", node="pod-k")
    fake_tpu.set_state(name, "PREEMPTED")

    with pytest.raises(BackendError, match="PREEMPTED"):
        compute.update_provisioning_data("pod-k", {"node_name": name})


def test_external_addresses_become_hostnames_and_internal_ones_stay_for_peers(fake_tpu):
    fake_tpu.creation_polls = 0
    fake_tpu.host_addresses = lambda node_id, hosts: [f"10.9.{k}.1" for k in range(hosts)]
    fake_tpu.external_addresses = ["34.1.1.1", "34.1.1.2"]
    compute = make_compute(fake_tpu)

    records = compute.create_instances(tpu_offer(compute, "v4-16"), 2, ["pod-l"])

    assert [(r.hostname, r.internal_ip) for r in records] == [
        ("34.1.1.1", "10.9.0.1"),
        ("34.1.1.2", "10.9.1.1"),
    ]


def test_host_count_must_match_the_slice(fake_tpu):
    compute = make_compute(fake_tpu)

    with pytest.raises(BackendError, match="4 hosts"):
        compute.create_instances(tpu_offer(compute, "v2-32"), 2, ["pod-m"])
    assert fake_tpu.create_calls == []


def test_list_slices_reports_the_nodes_of_a_zone(fake_tpu):
    cfg = tpu_client.TpuConfig(PROJECT, ["zone-a", "zone-b"], api_endpoint=fake_tpu.endpoint, timeout=5)
    client = tpu_client.make_client(cfg)
    tpu_create.create_slice(client, cfg, "pod-n", "v5litepod-16", {"team": "x"})

    [listed] = tpu_nodes.list_slices(client, cfg, "zone-a")

    assert listed.name == NODE.format(zone="zone-a", node="pod-n")
    assert listed.accelerator_type == "v5litepod-16"
    assert tpu_nodes.list_slices(client, cfg, "zone-b") == []


def test_offers_cover_every_family_and_multi_host_slices():
    cfg = tpu_client.TpuConfig(PROJECT, ["us-central2-b", "us-central1-a"], api_endpoint="http://127.0.0.1:1")
    offers = tpu_offers.slice_offers(cfg)

    assert {o.instance_type.rsplit("-", 1)[0] for o in offers} == set(FAMILIES)
    by_type = {o.instance_type: o for o in offers}
    assert by_type["v2-32"].hosts == 4 and by_type["v4-16"].hosts == 2 and by_type["v5litepod-16"].hosts == 4
    assert by_type["v2-8"].hosts == 1 and by_type["v6e-8"].hosts == 1
    assert by_type["v6e-8"].resources["tpu_chips"] == 8
    assert by_type["v5p-8"].resources["hbm_gb"] == 4 * FAMILIES["v5p"].hbm_gb_per_chip
    assert all(o.backend == "gcp" and o.zones == cfg.zones and o.region == "us-central2" for o in offers)
    assert any(o.hosts > 1 for o in offers if o.instance_type.startswith("v6e"))


def test_get_offers_matches_the_requested_slice_only():
    compute = GcpTpuCompute({"project_id": PROJECT, "zones": ["z-a"], "api_endpoint": "http://127.0.0.1:1"})

    assert [o.instance_type for o in compute.get_offers({"gpu": {"tpu": "tpu-v5e-8"}})] == ["v5litepod-8"]
    assert compute.get_offers({"gpu": {"name": ["A100"], "count": 8}}) == []
    assert compute.get_offers({"cpu": {"min": 2}}) == []


def test_a_server_that_never_answers_times_out_instead_of_hanging():
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    held: list[socket.socket] = []
    threading.Thread(target=lambda: held.append(silent.accept()[0]), daemon=True).start()
    cfg = tpu_client.TpuConfig(
        PROJECT, ["zone-a"], api_endpoint=f"http://127.0.0.1:{silent.getsockname()[1]}", timeout=1
    )
    try:
        started = time.monotonic()
        with pytest.raises(tpu_errors.TpuApiError, match="Timeout"):
            tpu_nodes.get_slice(tpu_client.make_client(cfg), cfg, NODE.format(zone="zone-a", node="x"))
        assert time.monotonic() - started < 5
    finally:
        for conn in held:
            conn.close()
        silent.close()


# -- zone fallback: the two shapes of a refusal ---------------------------------------------

STOCKOUT = "There is no more capacity in the zone \"{zone}\"; you can try in another zone where Cloud TPU Nodes are offered"


def refuse(server, zone: str, shape: str, http: HTTPStatus, rpc_code: int, message: str) -> None:
    """Make `zone` refuse creates at once (HTTP error) or later (the operation fails)."""
    if shape == "immediate":
        server.create_errors[zone] = (http, message)
    else:
        server.failed_operations[zone] = (rpc_code, message)


def poll_until_ready(compute: GcpTpuCompute, name: str, slice_name: str, progress):
    def look():
        nonlocal progress
        progress = compute.poll_group(name, slice_name, progress.backend_data)
        return progress.records

    return wait_until(look, 20, f"slice {name} READY")


@pytest.mark.parametrize("shape", ["immediate", "operation", "operation-at-once"])
def test_no_capacity_in_the_first_zone_goes_to_the_second_in_either_shape(fake_tpu, shape):
    fake_tpu.creation_polls = 0 if shape == "operation-at-once" else 1
    refuse(fake_tpu, "zone-a", shape, HTTPStatus.TOO_MANY_REQUESTS, 8, STOCKOUT.format(zone="zone-a"))
    compute = make_compute(fake_tpu, zones=["zone-a", "zone-b"])

    progress = compute.create_group(tpu_offer(compute, "v2-32"), 4, "pod-s")
    records = progress.records or poll_until_ready(compute, "pod-s", "v2-32", progress)

    assert fake_tpu.create_calls == [NODE.format(zone="zone-a", node="pod-s"),
                                     NODE.format(zone="zone-b", node="pod-s")]
    assert {r.region for r in records} == {"zone-b"} and len(records) == 4
    assert list(fake_tpu.nodes) == [NODE.format(zone="zone-b", node="pod-s")]


@pytest.mark.parametrize("shape", ["immediate", "operation"])
def test_no_capacity_anywhere_names_every_zone_and_what_it_said(fake_tpu, shape):
    for zone in ("zone-a", "zone-b"):
        refuse(fake_tpu, zone, shape, HTTPStatus.TOO_MANY_REQUESTS, 8, STOCKOUT.format(zone=zone))
    compute = make_compute(fake_tpu, zones=["zone-a", "zone-b"])

    with pytest.raises(NoCapacityError) as caught:
        progress = compute.create_group(tpu_offer(compute, "v4-16"), 2, "pod-t")
        poll_until_ready(compute, "pod-t", "v4-16", progress)

    text = str(caught.value)
    assert "zone-a: RESOURCE_EXHAUSTED There is no more capacity in the zone \"zone-a\"" in text
    assert "zone-b: RESOURCE_EXHAUSTED There is no more capacity in the zone \"zone-b\"" in text
    assert len(fake_tpu.create_calls) == 2 and fake_tpu.nodes == {}


@pytest.mark.parametrize("shape", ["immediate", "operation"])
@pytest.mark.parametrize(("http", "rpc_code", "fix"), [
    (HTTPStatus.BAD_REQUEST, 3, "runtime_version"),
    (HTTPStatus.FORBIDDEN, 7, "roles/tpu.admin in project muster-test"),
    (HTTPStatus.NOT_FOUND, 5, "project 'muster-test' exists"),
])
def test_a_create_that_cannot_succeed_fails_at_once_without_trying_other_zones(fake_tpu, shape, http, rpc_code, fix):
    refuse(fake_tpu, "zone-a", shape, http, rpc_code, "the API says no")
    compute = make_compute(fake_tpu, zones=["zone-a", "zone-b"])

    with pytest.raises(tpu_errors.TpuRefusedError, match="the API says no") as caught:
        progress = compute.create_group(tpu_offer(compute, "v2-8"), 1, "pod-u")
        poll_until_ready(compute, "pod-u", "v2-8", progress)

    assert fix in str(caught.value)
    assert not getattr(caught.value, "transient", False)
    assert fake_tpu.create_calls == [NODE.format(zone="zone-a", node="pod-u")]
    assert fake_tpu.nodes == {}


# -- lost creates ------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["slow", "lost"])
def test_a_create_whose_answer_never_arrives_is_adopted_by_its_id_not_made_twice(fake_tpu, how):
    if how == "slow":
        fake_tpu.slow_answers["create"] = 2.0  # past the client's timeout below
    else:
        fake_tpu.lost_answers["create"] = 1
    compute = make_compute(fake_tpu, zones=["zone-a", "zone-b"], timeout=0.5)

    progress = compute.create_group(tpu_offer(compute, "v2-32"), 4, "pod-v")
    assert progress.records is None
    records = poll_until_ready(compute, "pod-v", "v2-32", progress)

    name = NODE.format(zone="zone-a", node="pod-v")
    assert fake_tpu.create_calls == [name]
    assert list(fake_tpu.nodes) == [name]
    assert [r.backend_data["node_name"] for r in records] == [name] * 4


def test_a_lost_create_the_api_never_took_is_sent_again_with_the_same_id_in_the_same_zone(fake_tpu):
    fake_tpu.dropped_requests["create"] = 1  # the connection drops before the API hears it
    compute = make_compute(fake_tpu, zones=["zone-a", "zone-b"], timeout=0.5)

    progress = compute.create_group(tpu_offer(compute, "v2-8"), 1, "pod-x")
    assert progress.records is None and fake_tpu.nodes == {}
    records = poll_until_ready(compute, "pod-x", "v2-8", progress)

    name = NODE.format(zone="zone-a", node="pod-x")
    assert fake_tpu.create_calls == [name, name]
    assert list(fake_tpu.nodes) == [name] and records[0].region == "zone-a"


@pytest.mark.parametrize("kind", ["create", "get", "list", "delete", "operation"])
def test_every_tpu_api_call_gives_up_at_the_timeout(fake_tpu, kind):
    fake_tpu.slow_answers[kind] = 3.0
    fake_tpu.creation_polls = 5
    cfg = tpu_client.TpuConfig(PROJECT, ["zone-a"], api_endpoint=fake_tpu.endpoint, timeout=0.5)
    client = tpu_client.make_client(cfg)
    name = NODE.format(zone="zone-a", node="pod-w")
    if kind != "create":
        fake_tpu.slow_answers.pop(kind)
        created = tpu_create.create_slice(client, cfg, "pod-w", "v2-8", {})
        fake_tpu.slow_answers[kind] = 3.0
    calls = {
        "create": lambda: tpu_create.create_slice(client, cfg, "pod-w", "v2-8", {}).state["lost_at"] or None,
        "get": lambda: tpu_nodes.get_slice(client, cfg, name),
        "list": lambda: tpu_nodes.list_slices(client, cfg, "zone-a"),
        "delete": lambda: tpu_nodes.delete_slice(client, cfg, name),
        "operation": lambda: tpu_create.advance_slice(client, cfg, "pod-w", "v2-8", {}, created.state),
    }
    if kind == "create":
        assert calls["create"]() is not None, "a create that timed out is recorded as lost, not failed"
    else:
        with pytest.raises(tpu_errors.TpuApiError, match="Timeout"):
            calls[kind]()
