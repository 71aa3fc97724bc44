"""The fake's queued resources: create, get, list, delete with force, and the scripted states."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from http import HTTPStatus

from google.cloud import tpu_v2
from google.rpc import status_pb2

from backends.gcp.tpu_nodes import shape_name
from backends.gcp.tpu_shapes import parse_slice
from tests.fake_tpu.errors import FakeApiError
from tests.fake_tpu.nodes import NodeRecord

DEFAULT_QUEUED_SCRIPT = ["CREATING", "ACCEPTED", "PROVISIONING", "ACTIVE"]
QueuedStep = str | tuple[str, int, str]


class QueuedRecord:
    def __init__(self, qr: tpu_v2.QueuedResource, script: list[QueuedStep], expires: float | None):
        self.qr = qr
        self.script = list(script)
        self.expires = expires  # epoch seconds when validUntilDuration runs out (expire zones only)
        self.step = 0
        self.flex_seconds: float | None = None  # flex-start: the request's maxRunDuration
        self.flex_deadline: float | None = None  # when ACTIVE + maxRunDuration is over


class QueuedMixin:
    """Queued-resource calls of FakeTpuServer (its attributes are set in FakeTpuServer.__init__)."""

    def queued_state(self, name: str) -> str | None:
        with self.lock:
            rec = self.queued.get(name)
            return tpu_v2.QueuedResourceState.State(rec.qr.state.state).name if rec else None

    # -- queued resources ----------------------------------------------------------------------

    def _create_queued(self, project: str, zone: str, qr_id: str, body: bytes) -> str:
        parent = f"projects/{project}/locations/{zone}"
        name = f"{parent}/queuedResources/{qr_id}"
        if not qr_id:
            raise FakeApiError(HTTPStatus.BAD_REQUEST, "queuedResourceId is required")
        if zone in self.exhausted_zones:
            raise FakeApiError(HTTPStatus.TOO_MANY_REQUESTS, f"There is no more capacity in the zone {zone!r}")
        if zone in self.create_errors:
            raise FakeApiError(*self.create_errors[zone])
        if name in self.queued:
            raise FakeApiError(HTTPStatus.CONFLICT, f"queued resource {name} already exists")
        qr = tpu_v2.QueuedResource.from_json(body or b"{}", ignore_unknown_fields=True)
        flex = _flex_seconds(json.loads(body or b"{}"), spot="spot" in qr)
        specs = list(qr.tpu.node_spec)
        multi = specs[0].multislice_params if len(specs) == 1 and "multislice_params" in specs[0] else None
        if len(specs) != 1 or parse_slice(shape_name(specs[0].node)) is None or (
                bool(specs[0].node_id) == bool(multi)):
            raise FakeApiError(HTTPStatus.BAD_REQUEST, "tpu.nodeSpec needs one of nodeId and multisliceParams, "
                               "and a known acceleratorType")
        if multi is not None and multi.node_count < 2:
            raise FakeApiError(HTTPStatus.BAD_REQUEST, "multisliceParams.nodeCount must be more than 1")
        if specs[0].parent != parent:
            raise FakeApiError(HTTPStatus.BAD_REQUEST, f"nodeSpec.parent must be {parent}")
        for other, rec in self.queued.items():
            if other.rsplit("/", 1)[1] == qr_id and self._state_of(rec) not in ("FAILED", "SUSPENDED"):
                self.queued_overlaps.append((name, other))
        qr.name = name
        qr.create_time = datetime.now(UTC)
        expires = None
        if zone in self.queued_expire_zones:
            valid = qr.queueing_policy.valid_until_duration
            seconds = valid.total_seconds() if valid else 7 * 24 * 3600
            expires = time.time() + seconds
        rec = QueuedRecord(qr, self.queued_script.get(zone, DEFAULT_QUEUED_SCRIPT), expires)
        rec.flex_seconds = flex
        self.queued_bodies[name] = json.loads(body or b"{}")
        self.queued[name] = rec
        self._advance_queued(rec, count_poll=False)
        op_name = self._new_operation(parent, "create", name)
        self.operations[op_name]["queued"] = True
        return self._operation_json(op_name)

    def _get_queued(self, name: str) -> str:
        rec = self.queued.get(name)
        if rec is not None and self.queued_invisible_gets > 0:
            self.queued_invisible_gets -= 1
            rec = None
        if rec is None:
            raise FakeApiError(HTTPStatus.NOT_FOUND, f"queued resource {name} not found")
        self._advance_queued(rec, count_poll=True)
        return json.dumps(_with_flex(rec))

    def _list_queued(self, parent: str) -> str:
        found = [_with_flex(r) for n, r in self.queued.items() if n.startswith(parent + "/")]
        return json.dumps({"queuedResources": found})

    def _delete_queued(self, name: str, force: bool) -> str:
        rec = self.queued.get(name)
        if rec is None:
            raise FakeApiError(HTTPStatus.NOT_FOUND, f"queued resource {name} not found")
        owned = [n for n, r in self.nodes.items() if r.node.queued_resource == name]
        if owned and not force:
            raise FakeApiError(HTTPStatus.BAD_REQUEST,
                               f"queued resource {name} has nodes; delete them first or set force")
        for n in owned:  # force: the nodes first, then the request
            del self.nodes[n]
        del self.queued[name]
        parent = name.rsplit("/queuedResources/", 1)[0]
        return self._operation_json(self._new_operation(parent, "delete", name))

    @staticmethod
    def _state_of(rec: QueuedRecord) -> str:
        return tpu_v2.QueuedResourceState.State(rec.qr.state.state).name

    def _set_queued(self, rec: QueuedRecord, state: str, error: tuple[int, str] | None = None,
                    initiator: str = "") -> None:
        rec.qr.state = tpu_v2.QueuedResourceState(
            state=tpu_v2.QueuedResourceState.State[state],
            state_initiator=tpu_v2.QueuedResourceState.StateInitiator[initiator] if initiator else None,
            failed_data=tpu_v2.QueuedResourceState.FailedData(
                error=status_pb2.Status(code=error[0], message=error[1])) if error else None,
        )

    def set_queued_state(self, name: str, state: str, initiator: str = "SERVICE") -> None:
        with self.lock:
            self._set_queued(self.queued[name], state, initiator=initiator)

    def _advance_queued(self, rec: QueuedRecord, *, count_poll: bool) -> None:
        current = self._state_of(rec)
        if current in ("FAILED", "SUSPENDING", "SUSPENDED", "ACTIVE") and rec.step > 0:
            return  # final for the request (or changed by the test): stays as it is
        if rec.expires is not None:
            if time.time() < rec.expires:
                self._set_queued(rec, "WAITING_FOR_RESOURCES")
            else:
                valid = rec.qr.queueing_policy.valid_until_duration
                self._set_queued(rec, "FAILED", (4, (
                    f"Queued resource request expired: valid_until_duration {valid.total_seconds():.0f}s "
                    "reached before the resources became available")))
            rec.step = 1
            return
        step = rec.script[min(rec.step, len(rec.script) - 1)]
        if count_poll or rec.step == 0:
            rec.step += 1
        if isinstance(step, tuple):
            self._set_queued(rec, step[0], (step[1], step[2]))
            return
        self._set_queued(rec, step)
        if step == "ACTIVE":
            self._make_queued_node(rec)
            if rec.flex_seconds is not None and rec.flex_deadline is None:
                rec.flex_deadline = time.time() + rec.flex_seconds

    def reclaim_flex(self) -> None:
        """What Google does at a flex-start slice's end: "the TPU VMs are deleted and the queued
        resource moves to the SUSPENDED state". Checked on every request the fake answers."""
        now = time.time()
        for name, rec in self.queued.items():
            if rec.flex_deadline is None or now < rec.flex_deadline or self._state_of(rec) != "ACTIVE":
                continue
            for node in [n for n, r in self.nodes.items() if r.node.queued_resource == name]:
                del self.nodes[node]
            self._set_queued(rec, "SUSPENDED", initiator="SERVICE")
            self.flex_reclaimed.append(name)

    def _make_queued_node(self, rec: QueuedRecord) -> None:
        spec = rec.qr.tpu.node_spec[0]
        if "multislice_params" in spec:
            # As Google does: nodes `<nodeIdPrefix>-0` .. `-<nodeCount - 1>`, the prefix defaulting to the id.
            prefix = spec.multislice_params.node_id_prefix or rec.qr.name.rsplit("/", 1)[1]
            ids = [f"{prefix}-{i}" for i in range(spec.multislice_params.node_count)]
        else:
            ids = [spec.node_id]
        for node_id in ids:
            name = f"{spec.parent}/nodes/{node_id}"
            if name in self.nodes:
                continue
            node = tpu_v2.Node(spec.node)
            node.name = name
            node.queued_resource = rec.qr.name
            node.multislice_node = len(ids) > 1
            node.state = tpu_v2.Node.State.CREATING
            self.nodes[name] = NodeRecord(node, self.queued_node_polls, "")
            self._maybe_ready(self.nodes[name], count_poll=False)


def _flex_seconds(body: dict, *, spot: bool) -> float | None:
    """The flex-start fields of a create body (tpu_flex's names), checked as Google would."""
    from backends.gcp import tpu_flex

    model = body.get(tpu_flex.PROVISIONING_MODEL)
    run = (body.get(tpu_flex.RUN_DURATION) or {}).get(tpu_flex.MAX_RUN_DURATION)
    if model is None and run is None:
        return None
    if model != tpu_flex.FLEX_START or not isinstance(run, str) or not run.endswith("s"):
        raise FakeApiError(HTTPStatus.BAD_REQUEST, f"flex-start needs provisioningModel FLEX_START and "
                           f"runDuration.maxRunDuration like '3600s', not {model!r} / {run!r}")
    if spot:
        raise FakeApiError(HTTPStatus.BAD_REQUEST, "a flex-start request cannot be in the spot tier")
    seconds = float(run[:-1])
    if not 0 < seconds <= 7 * 86400:
        raise FakeApiError(HTTPStatus.BAD_REQUEST, f"maxRunDuration {run} is more than 7 days")
    return seconds


def _with_flex(rec: QueuedRecord) -> dict:
    """The request as Google shows it: a flex-start one keeps its fields (the typed client ignores them)."""
    out = json.loads(tpu_v2.QueuedResource.to_json(rec.qr))
    if rec.flex_seconds is not None:
        from backends.gcp import tpu_flex

        out.update(tpu_flex.flex_fields(int(rec.flex_seconds)))
        if rec.flex_deadline is not None:
            out[tpu_flex.RUN_DURATION]["terminationTime"] = datetime.fromtimestamp(
                rec.flex_deadline, UTC).isoformat().replace("+00:00", "Z")
    return out
