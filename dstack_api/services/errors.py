"""dstack's error format: `400 {"detail": [{"msg": ..., "code": ...}]}` with exactly one entry.

The client turns more than one entry into "Unexpected error", and a 404 into "URL not found", so
every refusal is folded into one entry and "not found" is 400 `resource_not_exists` (as dstack's
server answers). A bad or missing token is answered as dstack does: 403 with `detail` an object.
"""

from __future__ import annotations

from django.core.exceptions import RequestDataTooBig
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response

from muster.api_errors import InvalidInput
from muster.api_errors import exception_handler as muster_handler
from muster.crypto import DecryptError
from runs.configuration import ConfigurationError

ERROR = "error"
RESOURCE_EXISTS = "resource_exists"
RESOURCE_NOT_EXISTS = "resource_not_exists"


class DstackError(Exception):
    """A refusal in dstack's words (`code` one of the client's codes)."""

    def __init__(self, msg: str, code: str = ERROR, http_status: int = status.HTTP_400_BAD_REQUEST):
        super().__init__(msg)
        self.msg, self.code, self.http_status = msg, code, http_status


class NotFound(DstackError):
    def __init__(self, msg: str):
        super().__init__(msg, RESOURCE_NOT_EXISTS)


def detail(msg: str, code: str = ERROR, http_status: int = status.HTTP_400_BAD_REQUEST) -> Response:
    return Response({"detail": [{"msg": msg, "code": code}]}, status=http_status)


def _loc(loc: list) -> str:
    return ".".join(str(part) for part in loc)


def folded(errors: list[dict]) -> str:
    """Muster's [{loc, msg}, ...] as one message: each problem on its own line, located."""
    return "\n".join(f"{_loc(e.get('loc') or [])}: {e['msg']}" if e.get("loc") else str(e["msg"]) for e in errors)


def exception_handler(exc, context):
    if isinstance(exc, DstackError):
        return detail(exc.msg, exc.code, exc.http_status)
    if isinstance(exc, exceptions.NotAuthenticated | exceptions.AuthenticationFailed):
        return Response({"detail": {"msg": "Invalid token", "code": None}}, status=status.HTTP_403_FORBIDDEN)
    if isinstance(exc, Http404 | exceptions.NotFound):
        return detail(str(exc) or "Resource not found", RESOURCE_NOT_EXISTS)
    if isinstance(exc, exceptions.PermissionDenied):
        return detail(str(exc.detail), ERROR, status.HTTP_403_FORBIDDEN)
    if isinstance(exc, InvalidInput | DecryptError | ConfigurationError | exceptions.ValidationError
                  | exceptions.ParseError | exceptions.UnsupportedMediaType | RequestDataTooBig):
        answer = muster_handler(exc, context)  # Muster's own wording of the problem, then folded
        return detail(folded(answer.data["errors"]), ERROR, answer.status_code)
    answer = muster_handler(exc, context)
    if answer is None:
        return None  # a real bug: Django's 500, logged
    message = folded(answer.data["errors"]) if isinstance(answer.data, dict) and "errors" in answer.data else None
    return detail(str(message or exc), ERROR, answer.status_code)
