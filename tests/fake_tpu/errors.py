"""How the fake answers an error: the HTTP status, and the google.rpc status name in the body."""

from __future__ import annotations

from http import HTTPStatus


class FakeApiError(Exception):
    def __init__(self, code: HTTPStatus, message: str):
        super().__init__(message)
        self.code = code
        self.message = message



def grpc_status(code: HTTPStatus) -> str:
    return {
        HTTPStatus.BAD_REQUEST: "INVALID_ARGUMENT",
        HTTPStatus.UNAUTHORIZED: "UNAUTHENTICATED",
        HTTPStatus.FORBIDDEN: "PERMISSION_DENIED",
        HTTPStatus.NOT_FOUND: "NOT_FOUND",
        HTTPStatus.CONFLICT: "ALREADY_EXISTS",
        HTTPStatus.TOO_MANY_REQUESTS: "RESOURCE_EXHAUSTED",
        HTTPStatus.SERVICE_UNAVAILABLE: "UNAVAILABLE",
    }.get(code, "INTERNAL")

