"""A full disk (ENOSPC, EDQUOT) under MUSTER_DATA_DIR: told apart from a bug, answered with 507.

With the embedded default the data dir holds the SQLite database and the broker's messages, so a
full disk fails every write. It is the operator's problem, not the caller's, and it passes by
itself: the write was rolled back whole (SQLite and PostgreSQL undo a transaction that could not
be written; a broker message is renamed into place only once complete), so the caller may simply
try again once space is freed. Nothing here keeps state: the next request after space is back
goes through, with no restart.
"""

from __future__ import annotations

import errno
import os
import shutil
import sys
from pathlib import Path

from django.conf import settings
from django.core.signals import got_request_exception
from django.http import JsonResponse
from django.shortcuts import render

FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT}
MESSAGE = ("the server's disk is full (MUSTER_DATA_DIR is out of space): the request failed. Once an operator "
           "frees space the server recovers by itself (no restart): then try again")
SQLITE_FULL = 13
POSTGRES_DISK_FULL = "53100"


def is_disk_full(exc: BaseException | None) -> bool:
    """True when `exc` (or what caused it: Django and kombu wrap the error they got) is a full disk."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, OSError) and exc.errno in FULL_ERRNOS:
            return True
        if getattr(exc, "sqlite_errorcode", None) == SQLITE_FULL or "database or disk is full" in str(exc):
            return True
        if getattr(exc, "sqlstate", None) == POSTGRES_DISK_FULL or getattr(exc, "pgcode", None) == POSTGRES_DISK_FULL:
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def data_dir_full() -> str:
    """Why the data dir cannot take writes now ("" when it can): less than DATA_DIR_MIN_FREE bytes
    free, or a small write refused (a quota, EDQUOT, shows only there)."""
    where = Path(settings.DATA_DIR)
    minimum = int(settings.MUSTER["DATA_DIR_MIN_FREE"])
    free = shutil.disk_usage(where).free
    if free < minimum:
        return f"the data dir {where} is full: {free} bytes free, less than MUSTER_DATA_DIR_MIN_FREE ({minimum})"
    probe = where / f".healthz-{os.getpid()}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, b"\0" * 4096)
        finally:
            os.close(fd)
    except OSError as exc:
        if exc.errno in FULL_ERRNOS:
            return f"the data dir {where} is full: a write failed ({exc.strerror})"
        raise
    finally:
        probe.unlink(missing_ok=True)
    return ""


def disk_full_response(request):
    if request.path.startswith("/api/"):
        return JsonResponse({"errors": [{"loc": [], "msg": MESSAGE}]}, status=507)
    return render(request, "console/disk_full.html", {"message": MESSAGE}, status=507)


def _note_disk_full(sender, request=None, **_) -> None:
    # Django turns an exception into a 500 (for a view, or a middleware's own write: the session's)
    # before an outer middleware sees it: this is where the exception itself is still at hand.
    if request is not None and is_disk_full(sys.exc_info()[1]):
        request.muster_disk_full = True


got_request_exception.connect(_note_disk_full, dispatch_uid="muster.disk_full")


class DiskFullMiddleware:
    """Outermost: a request that failed on a full disk answers 507 (JSON under /api/, a page for the
    console) instead of a 500."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if response.status_code == 500 and getattr(request, "muster_disk_full", False):
            return disk_full_response(request)
        return response
