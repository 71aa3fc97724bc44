"""What a runner says about its host and jobs, checked before anything acts on it.

A status document comes from a host the server does not control (a broken runner file, a full
disk, someone else's program on the path). Whatever its shape, the engine must not fail on it:
a document that is not what the runner prints is a BackendError, handled like a host that does
not answer, so one bad host never stops the watch of every other job.
"""

from __future__ import annotations

from typing import Any

from backends.base import BackendError
from runner import protocol


def checked(doc: Any) -> dict[str, Any]:
    """`doc` if it has the runner's shape (runner/protocol.py status_problem); BackendError otherwise."""
    problem = protocol.status_problem(doc)
    if problem is not None:
        raise BackendError(problem)
    return doc


def read(host) -> dict[str, Any]:
    """One status round trip, checked; any failure to get a well-formed answer is a BackendError."""
    try:
        doc = host.status()
    except BackendError:
        raise
    except (ValueError, TypeError, OSError) as exc:  # a backend that passes the runner's garbage on
        raise BackendError(f"the runner's status could not be read: {exc}") from exc
    return checked(doc)

