"""One error shape for the whole API: {"errors": [{"loc": [...], "msg": "..."}]}, whatever went wrong.

A body that cannot be read (malformed JSON: 400; a media type the API does not take: 415) is bad
input too and gets the same shape, located at the body (`loc: []`). Authentication, permission,
not-found, method and rate errors keep their status (and headers: WWW-Authenticate, Retry-After)
and say what DRF says, in the same shape at `loc: []`: a client reads one shape, never two.
"""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from rest_framework import status
from rest_framework.exceptions import ParseError, UnsupportedMediaType, ValidationError
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from muster import disk
from muster.crypto import DecryptError
from runs.configuration import ConfigurationError


class InvalidInput(Exception):
    """Raised by services for input that is well-formed but not acceptable (name taken, fleet busy)."""

    status_code = status.HTTP_400_BAD_REQUEST

    def __init__(self, loc: list, msg: str):
        super().__init__(msg)
        self.errors = [{"loc": loc, "msg": msg}]


class NotAllowed(InvalidInput):
    """Input the caller may not send (a local fleet from a non-superuser): 403, located like a 400."""

    status_code = status.HTTP_403_FORBIDDEN


class Conflict(InvalidInput):
    """Input that clashes with the resource's present state (an update of a run that is not a
    running service): 409, located like a 400."""

    status_code = status.HTTP_409_CONFLICT


def _flatten(detail, loc: list) -> list[dict]:
    if isinstance(detail, dict):
        out = []
        for key, value in detail.items():
            out.extend(_flatten(value, loc if key == "non_field_errors" else [*loc, key]))
        return out
    if isinstance(detail, list):
        if all(not isinstance(d, (dict, list)) for d in detail):
            return [{"loc": loc, "msg": str(d)} for d in detail]
        out = []
        for i, item in enumerate(detail):
            out.extend(_flatten(item, [*loc, i]))
        return out
    return [{"loc": loc, "msg": str(detail)}]


def errors_response(errors: list[dict], code: int = status.HTTP_400_BAD_REQUEST) -> Response:
    return Response({"errors": errors}, status=code)


def exception_handler(exc, context):
    if isinstance(exc, RequestDataTooBig):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return errors_response([{"loc": [], "msg": f"the request body is over {limit} bytes, the most this server "
                                                   "takes (DATA_UPLOAD_MAX_MEMORY_SIZE)"}],
                               status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)
    if disk.is_disk_full(exc):
        return errors_response([{"loc": [], "msg": disk.MESSAGE}], status.HTTP_507_INSUFFICIENT_STORAGE)
    if isinstance(exc, InvalidInput | DecryptError):
        return errors_response(exc.errors, exc.status_code)
    if isinstance(exc, ConfigurationError):
        return errors_response(exc.errors)
    if isinstance(exc, ValidationError):
        return errors_response(_flatten(exc.detail, []))
    if isinstance(exc, ParseError | UnsupportedMediaType):
        hint = "send a JSON object (Content-Type: application/json)"
        return errors_response([{"loc": [], "msg": f"{exc.detail}: {hint}"}], exc.status_code)
    answer = drf_exception_handler(exc, context)
    if answer is not None and isinstance(answer.data, dict) and set(answer.data) == {"detail"}:
        answer.data = {"errors": [{"loc": [], "msg": str(answer.data["detail"])}]}
    return answer
