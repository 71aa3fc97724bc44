"""Counting database statements where they happen (bench only).

Every worker process wraps its Django connection with `execute_wrapper`; each task's statement count
is added to a Redis hash when the task ends (one pipelined round trip per task, no database work).
The web process does the same per request through a middleware. Keys (in BENCH_STATS_URL):
  bench:q  field <task or view>  statements
  bench:n  field <task or view>  calls
  bench:ms field <task or view>  milliseconds spent
  bench:x  field <task or view>  database transactions: statements run in autocommit plus the
                                 commits and rollbacks of transaction blocks
"""

from __future__ import annotations

import os
import threading
import time

import redis  # here, not at the first request: gunicorn's --preload master imports it once for its workers

_state = {"client": None}
_local = threading.local()  # per thread: gunicorn threads and the driver never mix counts


def _count(execute, sql, params, many, context):
    _local.queries = getattr(_local, "queries", 0) + 1
    if not context["connection"].in_atomic_block:
        _local.xacts = getattr(_local, "xacts", 0) + 1
    return execute(sql, params, many, context)


def _counting(method):
    def wrapper(*args, **kwargs):
        _local.xacts = getattr(_local, "xacts", 0) + 1
        return method(*args, **kwargs)

    wrapper._bench = True
    return wrapper


def _client():
    if _state["client"] is None:
        _state["client"] = redis.Redis.from_url(os.environ["BENCH_STATS_URL"])
    return _state["client"]


def _ensure_wrapped() -> None:
    from django.db import connections

    conn = connections["default"]
    if _count not in conn.execute_wrappers:
        conn.execute_wrappers.append(_count)
    if not getattr(conn._commit, "_bench", False):
        conn._commit = _counting(conn._commit)
        conn._rollback = _counting(conn._rollback)


def _flush(name: str, queries: int, ms: float) -> None:
    xacts, _local.xacts = getattr(_local, "xacts", 0), 0
    try:
        pipe = _client().pipeline(transaction=False)
        pipe.hincrby("bench:q", name, queries)
        pipe.hincrby("bench:x", name, xacts)
        pipe.hincrby("bench:n", name, 1)
        pipe.hincrbyfloat("bench:ms", name, ms)
        pipe.execute()
    except Exception:  # noqa: BLE001 - a stats hiccup (chaos restarts Redis) must not fail a task
        _state["client"] = None


def _prerun(task=None, **_):
    _ensure_wrapped()
    _local.queries = _local.xacts = 0
    _local.t0 = time.perf_counter()


def _postrun(task=None, **_):
    _flush(task.name if task else "?", getattr(_local, "queries", 0),
           (time.perf_counter() - getattr(_local, "t0", time.perf_counter())) * 1000)
    _local.queries = 0


def connect_celery_signals() -> None:
    from celery.signals import task_postrun, task_prerun

    task_prerun.connect(_prerun, weak=False)
    task_postrun.connect(_postrun, weak=False)


class QueryCountMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        _ensure_wrapped()
        _local.queries = _local.xacts = 0
        t0 = time.perf_counter()
        response = self.get_response(request)
        match = getattr(request, "resolver_match", None)
        name = f"web:{request.method}:{match.url_name if match else request.path}"
        _flush(name, _local.queries, (time.perf_counter() - t0) * 1000)
        return response


def read(client) -> dict[str, dict[str, float]]:
    """{name: {"queries", "calls", "ms"}} from the stats Redis."""
    q = {k.decode(): int(v) for k, v in client.hgetall("bench:q").items()}
    n = {k.decode(): int(v) for k, v in client.hgetall("bench:n").items()}
    ms = {k.decode(): float(v) for k, v in client.hgetall("bench:ms").items()}
    x = {k.decode(): int(v) for k, v in client.hgetall("bench:x").items()}
    return {k: {"queries": q.get(k, 0), "xacts": x.get(k, 0), "calls": n.get(k, 0), "ms": ms.get(k, 0.0)}
            for k in sorted(set(q) | set(n))}


def reset(client) -> None:
    client.delete("bench:q", "bench:n", "bench:ms", "bench:x")


def wrap_this_thread() -> None:
    """Count the statements of the calling thread (the driver); read them with `local_count()`."""
    _ensure_wrapped()


def local_count() -> int:
    return getattr(_local, "queries", 0)


def local_xacts() -> int:
    return getattr(_local, "xacts", 0)
