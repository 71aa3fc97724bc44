"""The workloads both systems get: the same requests from the same kind of clients.

A client is one thread with one keep-alive HTTP connection; a "run" is a plan then an apply (the
apply body built from the plan's answer, as the dstack CLI does; Muster's apply takes the same YAML
again, as `muster apply` does), or an apply alone where the workload does not ask for a plan.
"""

from __future__ import annotations

import http.client
import json
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Target:
    """One system under test, as the clients see it."""

    name: str
    port: int
    headers: dict
    plan_path: str
    apply_path: str
    plan_body: Callable[[], dict]
    apply_body: Callable[[dict | None], dict]  # from the plan's answer (None: no plan was asked)
    run_name: Callable[[dict], str]  # from the apply's answer
    extra: dict = field(default_factory=dict)


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))] if ordered else float("nan")


def _post(conn: http.client.HTTPConnection, path: str, body: dict, headers: dict) -> tuple[int, bytes, float]:
    t = time.perf_counter()
    try:
        conn.request("POST", path, body=json.dumps(body).encode(), headers=headers)
        resp = conn.getresponse()
        data = resp.read()
    except (OSError, http.client.HTTPException) as exc:
        # counted as an error, not retried (an apply may have landed); the next request reconnects
        conn.close()
        return 599, repr(exc).encode(), (time.perf_counter() - t) * 1000
    return resp.status, data, (time.perf_counter() - t) * 1000


def clients(target: Target, count: int, n_clients: int, plan: bool = True) -> dict:
    plan_ms: list[float] = []
    apply_ms: list[float] = []
    names: list[str] = []
    errors: list[str] = []
    lock = threading.Lock()
    per_client = [count // n_clients + (1 if i < count % n_clients else 0) for i in range(n_clients)]

    def client(n: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", target.port, timeout=120)
        for _ in range(n):
            planned = None
            if plan:
                status, data, ms = _post(conn, target.plan_path, target.plan_body(), target.headers)
                with lock:
                    plan_ms.append(ms)
                if status >= 300:
                    with lock:
                        errors.append(f"plan: {status} {data[:300]!r}")
                    continue
                planned = json.loads(data)
            status, data, ms = _post(conn, target.apply_path, target.apply_body(planned), target.headers)
            with lock:
                apply_ms.append(ms)
                if status >= 300:
                    errors.append(f"apply: {status} {data[:300]!r}")
                else:
                    names.append(target.run_name(json.loads(data)))
        conn.close()

    threads = [threading.Thread(target=client, args=(n,)) for n in per_client]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    out = {"runs": len(names), "seconds": seconds, "runs_per_s": len(names) / seconds, "names": names,
           "errors": errors[:5], "error_count": len(errors), "started_at": t0}
    for label, values in (("plan", plan_ms), ("apply", apply_ms)):
        if values:
            out[f"{label}_p50_ms"] = statistics.median(values)
            out[f"{label}_p99_ms"] = pct(values, 99)
    return out


def warm(target: Target, n: int = 4) -> None:
    """Both servers import their views and parsers before the clock starts."""
    conn = http.client.HTTPConnection("127.0.0.1", target.port, timeout=120)
    for _ in range(n):
        _post(conn, target.plan_path, target.plan_body(), target.headers)
    conn.close()
