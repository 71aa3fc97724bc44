"""What a runner says about its host and jobs, checked before anything acts on it.

A status document comes from a host the server does not control (a broken runner file, a full
disk, someone else's program on the path). Whatever its shape, the engine must not fail on it:
a document that is not what the runner prints is a BackendError, handled like a host that does
not answer, so one bad host never stops the watch of every other job.
"""

from __future__ import annotations

from typing import Any

from backends.base import BackendError

_NUMBER = (int, float)
_TIMES = ("start_time", "end_time", "time")


def checked(doc: Any) -> dict[str, Any]:
    """`doc` if it has the runner's shape (the fields the engine reads); BackendError otherwise."""
    if not isinstance(doc, dict):
        raise BackendError(f"the runner's status is not an object: {_short(doc)}")
    if not isinstance(doc.get("agent_alive", False), bool):
        raise BackendError(f"the runner's agent_alive is not true or false: {_short(doc.get('agent_alive'))}")
    jobs = doc.get("jobs", {})
    if jobs is None:
        jobs = doc["jobs"] = {}
    if not isinstance(jobs, dict):
        raise BackendError(f"the runner's jobs are not an object: {_short(jobs)}")
    for job_id, state in jobs.items():
        _check_job(job_id, state)
    return doc


def _check_job(job_id: str, state: Any) -> None:
    if not isinstance(state, dict):
        raise BackendError(f"the runner's status of job {job_id} is not an object: {_short(state)}")
    if not isinstance(state.get("state", ""), str):
        raise BackendError(f"the runner's state of job {job_id} is not a string: {_short(state.get('state'))}")
    for key in _TIMES:
        value = state.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, _NUMBER)):
            raise BackendError(f"the runner's {key} of job {job_id} is not a number: {_short(value)}")
    size = state.get("log_size")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 0):
        raise BackendError(f"the runner's log_size of job {job_id} is not a byte count: {_short(size)}")
    code = state.get("exit_status")
    if code is not None and (isinstance(code, bool) or not isinstance(code, int) or not -2**31 <= code < 2**31):
        raise BackendError(f"the runner's exit_status of job {job_id} is not an integer: {_short(code)}")


def read(host) -> dict[str, Any]:
    """One status round trip, checked; any failure to get a well-formed answer is a BackendError."""
    try:
        doc = host.status()
    except BackendError:
        raise
    except (ValueError, TypeError, OSError) as exc:  # a backend that passes the runner's garbage on
        raise BackendError(f"the runner's status could not be read: {exc}") from exc
    return checked(doc)


def _short(value: Any) -> str:
    return repr(value)[:200]
