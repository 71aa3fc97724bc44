"""Flex-start queued resources: the request's extra fields and the one create call that sends them.

Flex-start (Dynamic Workload Scheduler through queued resources; cloud.google.com/tpu/docs/
request-using-flex-start) is asked for with gcloud's `--provisioning-model=flex-start` and
`--max-run-duration`: the request waits until capacity frees, the slice is then given for that
long, not preempted meanwhile, and at its end "the TPU VMs are deleted and the queued resource
moves to the SUSPENDED state". google-cloud-tpu (1.28) has no field for either, so the typed
client cannot carry them: the create is sent here as the client would send it (its own message
serialization, its own authorized session and endpoint) with the two fields added, and its errors
are raised as the client raises them, so zone fallback and adoption treat it like any other
create. Every other call (get, list, delete) stays the client's.
"""

from __future__ import annotations

import json
from typing import Any

from google.api_core import exceptions as gexc
from google.cloud import tpu_v2
from google.cloud.tpu_v2.services.tpu.transports.rest import TpuRestTransport

from backends.base import BackendError
from backends.gcp.tpu_client import TpuConfig

# Google's names for the two fields on the QueuedResource (gcloud's flags, as the REST body spells
# them): kept here alone so that one edit follows a change on Google's side.
PROVISIONING_MODEL = "provisioningModel"
FLEX_START = "FLEX_START"
RUN_DURATION = "runDuration"
MAX_RUN_DURATION = "maxRunDuration"


def flex_fields(max_run_duration: int) -> dict[str, Any]:
    return {PROVISIONING_MODEL: FLEX_START, RUN_DURATION: {MAX_RUN_DURATION: f"{int(max_run_duration)}s"}}


def create_flex(client: tpu_v2.TpuClient, cfg: TpuConfig, parent: str, qr_id: str,
                request: tpu_v2.QueuedResource) -> None:
    """POST the request with the flex-start fields; raises google.api_core exceptions as the client does."""
    transport = client.transport
    if not isinstance(transport, TpuRestTransport):
        raise BackendError("flex-start needs the TPU API's REST transport (GCP transport: rest): the gRPC "
                           "client has no field for it")
    assert cfg.max_run_duration is not None
    body = {**json.loads(tpu_v2.QueuedResource.to_json(request)), **flex_fields(cfg.max_run_duration)}
    # The transport's own session and host: its credentials and endpoint, as the typed call would use.
    response = transport._session.post(  # noqa: SLF001 (the client exposes no public session)
        f"{transport.host}/v2/{parent}/queuedResources", params={"queuedResourceId": qr_id},
        data=json.dumps(body), headers={"Content-Type": "application/json"}, timeout=cfg.timeout)
    if response.status_code >= 400:
        raise gexc.from_http_response(response)
