"""The fake's long-running operations: what a create or delete answers, and reading one later."""

from __future__ import annotations

from http import HTTPStatus

from google.cloud import tpu_v2
from google.longrunning import operations_pb2
from google.protobuf import any_pb2, empty_pb2, json_format
from google.rpc import status_pb2

from tests.fake_tpu.errors import FakeApiError


class OperationsMixin:
    """Operation calls of FakeTpuServer (its attributes are set in FakeTpuServer.__init__)."""

    def _get_operation(self, name: str) -> str:
        op = self.operations.get(name)
        if op is None:
            raise FakeApiError(HTTPStatus.NOT_FOUND, f"operation {name} not found")
        rec = self.nodes.get(op["target"])
        if op["verb"] == "create" and rec is not None:
            self._maybe_ready(rec, count_poll=True)
        return self._operation_json(name)

    def _new_operation(self, parent: str, verb: str, target: str) -> str:
        self._op_seq += 1
        name = f"{parent}/operations/operation-{self._op_seq}"
        self.operations[name] = {"verb": verb, "target": target}
        return name

    def _operation_json(self, name: str) -> str:
        op = self.operations[name]
        meta = any_pb2.Any()
        meta.Pack(tpu_v2.OperationMetadata.pb(tpu_v2.OperationMetadata(target=op["target"], verb=op["verb"])))
        msg = operations_pb2.Operation(name=name, metadata=meta)
        if op["verb"] == "delete":
            msg.done = True
            msg.response.Pack(empty_pb2.Empty())
        elif "error" in op:
            code, message = op["error"]
            msg.done = True
            msg.error.CopyFrom(status_pb2.Status(code=code, message=message))
        elif op.get("queued"):
            # Google answers a queued-resource create once the request is recorded.
            qrec = self.queued.get(op["target"])
            if qrec is not None:
                msg.done = True
                msg.response.Pack(tpu_v2.QueuedResource.pb(qrec.qr))
        else:
            rec = self.nodes.get(op["target"])
            if rec is not None and rec.node.state == tpu_v2.Node.State.READY:
                msg.done = True
                msg.response.Pack(tpu_v2.Node.pb(rec.node))
        return json_format.MessageToJson(msg)
