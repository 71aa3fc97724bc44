"""What the TPU API's errors mean to Muster: one error family for callers, and the verdict on a
refused create.

Everything the client raises becomes a `BackendError` (`api_errors`), so callers handle one family.
A create ends in one of four ways, whether the API says so at once (an HTTP error) or later (the
create's Operation finishing with a google.rpc.Status error, which the client's own
`operation.result()` would raise as the same exception class):
- no capacity or quota (429 / code 8): the next zone is tried;
- a request that cannot succeed anywhere (400/3, 401/16, 403/7, 404/5): it fails at once;
- ALREADY_EXISTS (409/6) for our own node id: the node is adopted;
- anything else (timeout, connection lost, 5xx): unknown. The API may have accepted the create,
  so nothing is given up and no other zone is tried; later looks find the node by its id.

Error mapping worth knowing: over REST a 429 surfaces as `TooManyRequests` (gRPC gives its
subclass `ResourceExhausted`) and a 409 as `Conflict` (gRPC: `AlreadyExists`), so the parents are
caught to behave the same on both transports.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import requests
from google.api_core import exceptions as gexc

from backends.base import BackendError
from backends.gcp.tpu_client import TpuConfig

# What a refused create means (see the module docstring).
NEXT_ZONE, FATAL, EXISTS, UNSURE = "next_zone", "fatal", "exists", "unsure"


class TpuApiError(BackendError):
    """The TPU API refused a call or could not be reached (timeouts included); worth retrying later."""

    transient = True  # callers polling a slice look again instead of giving the slice up


class TpuRefusedError(BackendError):
    """The TPU API refused a create in a way no other zone or later try can fix; says what to fix."""


@contextmanager
def api_errors(what: str) -> Iterator[None]:
    """Turn what the client raises into BackendError, so callers handle one family of errors."""
    try:
        yield
    except BackendError:
        raise
    except gexc.GoogleAPICallError as exc:
        raise TpuApiError(f"{what}: {exc.code} {exc.message}") from exc
    except (gexc.RetryError, requests.exceptions.RequestException) as exc:
        # A REST timeout arrives as requests' ReadTimeout, untranslated by api_core.
        raise TpuApiError(f"{what}: {type(exc).__name__}: {exc}") from exc


def classify_refusal(exc: Exception) -> str:
    """Which of the four outcomes in the module docstring a refused create has."""
    if isinstance(exc, gexc.TooManyRequests):  # gRPC's ResourceExhausted is a subclass
        return NEXT_ZONE
    if isinstance(exc, gexc.Conflict) and not isinstance(exc, gexc.Aborted):  # AlreadyExists is one
        return EXISTS
    if isinstance(exc, (gexc.BadRequest, gexc.Unauthorized, gexc.Forbidden, gexc.NotFound)):
        return FATAL
    return UNSURE


def api_message(exc: Exception) -> str:
    """The status name and message as Google wrote them, without the request line REST adds."""
    if not isinstance(exc, gexc.GoogleAPICallError):
        return f"{type(exc).__name__}: {exc}"
    code = exc.grpc_status_code.name if exc.grpc_status_code is not None else str(exc.code)
    message = exc.message
    response = exc.response
    if isinstance(response, requests.Response):
        try:
            error = response.json().get("error") or {}
        except ValueError:
            error = {}
        if isinstance(error, dict):
            code = str(error.get("status") or code)
            message = str(error.get("message") or message)
    return f"{code} {message}"


def fix_for(exc: Exception, cfg: TpuConfig, zone: str) -> str:
    if isinstance(exc, gexc.Unauthorized):
        return "Fix: the credentials were rejected; check MUSTER_GCP_CREDENTIALS (or GCP.credentials)."
    if isinstance(exc, gexc.Forbidden):
        return (f"Fix: give the server's service account roles/tpu.admin in project {cfg.project_id} "
                "and enable the Cloud TPU API there.")
    if isinstance(exc, gexc.NotFound):
        return f"Fix: check that project {cfg.project_id!r} exists and that zone {zone!r} offers Cloud TPU."
    return ("Fix: check the slice type, spot, runtime_version and network against what zone "
            f"{zone!r} offers (the fleet's zones, spot and runtime_version; GCP.network).")


def operation_error(op: Any) -> gexc.GoogleAPICallError:
    # What google.api_core.operation.Operation.result() would raise for this finished operation.
    return gexc.from_grpc_status(op.error.code, op.error.message, errors=(op.error,), response=op)


