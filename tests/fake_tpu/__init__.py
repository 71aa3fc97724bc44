"""A loopback fake of the Cloud TPU v2 REST API, driven by the real `tpu_v2.TpuClient`.

There is no official TPU emulator, so the gcp backend is tested by pointing the real client
(REST transport, `api_endpoint="http://127.0.0.1:PORT"`, anonymous credentials) at this server.
Bodies are produced and parsed with the library's own message types, so a field-name or
enum-encoding mismatch shows up here rather than in production.

Behaviour worth knowing when writing tests:
- create answers with a long-running Operation (google.longrunning.Operation: name, metadata,
  done, and once done either `response` (the Node) or `error` (a google.rpc.Status with code,
  message, details)); the node stays CREATING for `creation_polls` GETs (of the node or of its
  operation) and then turns READY with one network endpoint per host, the host count coming from
  the slice-shape table;
- a create is refused in one of the two shapes Google uses, per zone:
  * at once, as an HTTP error whose body is {"error": {"code", "status", "message"}}:
    `exhausted_zones` -> 429 RESOURCE_EXHAUSTED, `unavailable_zones` -> 503 UNAVAILABLE,
    `create_errors[zone] = (HTTPStatus, message)` for anything else (400, 403, 404, ...);
    `node_create_errors[end] = (HTTPStatus, message)` refuses, in every zone, each node id that
    ends with `end` (e.g. "-s-1": one slice of a multislice set that cannot be had);
  * later, as an accepted create whose Operation finishes with an error:
    `failed_operations[zone] = (google.rpc code, message)`, e.g. (8, "There is no more capacity
    in the zone ..."). The node is CREATING meanwhile and is gone once the operation failed; with
    `creation_polls = 0` the create's own answer is already the failed operation;
- answers can be slow or lost, per kind of call ("create", "get", "list", "delete",
  "operation"): `slow_answers[kind] = seconds` does the work, then waits that long before
  answering (past the client's timeout, the client gives up on a call that took effect);
  `lost_answers[kind] = n` does the work and then drops the connection without an answer, for the
  next n calls of that kind; `dropped_requests[kind] = n` drops the connection without doing the
  work (the call is still listed in `calls` and `create_calls`);
- delete removes the node at once and answers with a finished Operation;
- queued resources (`projects.locations.queuedResources`: create with `queuedResourceId`, get,
  list, delete with `force`) follow a scripted state sequence per zone, one step per GET of the
  request: `queued_script[zone]` is a list of QueuedResourceState names (default
  CREATING, ACCEPTED, PROVISIONING, ACTIVE), a step may be ("FAILED", google.rpc code, message)
  for `failedData.error`, and the last step repeats; a request may be for one node (`nodeId`) or a
  multislice set (`multisliceParams {nodeCount, nodeIdPrefix}`: nodes `<prefix>-0` .. `-<N-1>`,
  each `multisliceNode`); ACTIVE creates the node (or the set's nodes) (READY, its
  `queuedResource` naming the request; READY after `queued_node_polls` GETs of it). `queued_expire_zones`: the request waits
  (WAITING_FOR_RESOURCES) until its `queueingPolicy.validUntilDuration` is over, then FAILED with
  the expiry (code 4). A duplicate id in a zone is 409 ALREADY_EXISTS; delete without force is
  refused while the request still has a node (as Google does); `queued_overlaps` lists every
  create made while another request of that id was live in another zone (it must stay empty);
  `queued_invisible_gets = n` answers the next n GETs of an existing request 404, as a lookup
  that has not caught up with a create yet;
- flex-start: a create body with `provisioningModel: FLEX_START` and `runDuration.maxRunDuration`
  (backends/gcp/tpu_flex.py's names; spot with it is a 400) is echoed back by get and list; once
  ACTIVE, its `runDuration.terminationTime` is ACTIVE + maxRunDuration, and at that time, as Google
  documents, its nodes are deleted and the request goes SUSPENDED (checked on every request;
  `flex_reclaimed` lists them); `queued_bodies` keeps each queued create's body as sent;
- a running slice can be lost the ways Google loses it: `set_state(name, "PREEMPTED")`,
  `preempt(name)` (the node PREEMPTED and its queued resource SUSPENDED by the SERVICE),
  `vanish(name)` (the node is simply gone).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fake_tpu.errors import FakeApiError
from tests.fake_tpu.queued import DEFAULT_QUEUED_SCRIPT
from tests.fake_tpu.server import FakeTpuServer

__all__ = ["DEFAULT_QUEUED_SCRIPT", "FakeApiError", "FakeTpuServer", "fake_tpu"]


@pytest.fixture
def fake_tpu() -> Iterator[FakeTpuServer]:
    server = FakeTpuServer().start()
    try:
        yield server
    finally:
        server.stop()
