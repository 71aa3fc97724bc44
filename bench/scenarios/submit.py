"""submit: runs submitted over HTTP by concurrent clients, plan then apply, as the CLI does.

A real web process (gunicorn, 2 processes x 4 threads, bench.settings) with the workers and beat
running behind it (the submitted runs are placed on a hollow fleet while the clients submit).
Measures runs/s, p50/p99 of plan and of apply, and statements per request (counted in the web
process by a bench-only middleware).
"""

from __future__ import annotations

import http.client
import json
import statistics
import threading
import time

from bench import harness, instrument
from bench.hollow import make_hollow_fleet
from bench.scenarios.common import project_with_user, table, task_yaml


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def ensure_web(session: harness.Session) -> int:
    if "web" not in session.procs:
        _, port = session.start_web()
        session.web_port = port  # type: ignore[attr-defined]
    return session.web_port  # type: ignore[attr-defined]


def run(session: harness.Session, args) -> dict:
    count = args.runs or 200
    clients = args.clients
    if not any(n.startswith("worker") for n in session.procs):
        for i in range(args.workers):
            session.start_worker(f"worker{i}", args.concurrency)
    if "beat" not in session.procs:
        session.start_beat()
    port = ensure_web(session)
    project, user, token = project_with_user(f"submit-{int(time.time())}")
    make_hollow_fleet(project, "hollow", count * 4)
    body = json.dumps({"configuration": task_yaml(4), "env": {}}).encode()
    headers = {"Authorization": f"Token {token}", "Content-Type": "application/json", "Accept": "application/json"}
    base = f"/api/projects/{project.name}/"
    plan_ms: list[float] = []
    apply_ms: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    per_client = [count // clients + (1 if i < count % clients else 0) for i in range(clients)]

    def client(n: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        for _ in range(n):
            for path, sink in (("runs/plan", plan_ms), ("runs/", apply_ms)):
                t = time.perf_counter()
                conn.request("POST", base + path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                ms = (time.perf_counter() - t) * 1000
                with lock:
                    sink.append(ms)
                    if resp.status >= 300:
                        errors.append(f"{path}: {resp.status} {data[:200]!r}")
        conn.close()

    warm = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    for _ in range(8):  # both gunicorn processes import the views and the configuration parser first
        warm.request("POST", base + "runs/plan", body=body, headers=headers)
        warm.getresponse().read()
    warm.close()
    r = session.redis()
    instrument.reset(r)
    threads = [threading.Thread(target=client, args=(n,)) for n in per_client]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    web = {k: v for k, v in instrument.read(r).items() if k.startswith("web:")}
    plan_stats = web.get("web:POST:run-plan", {})
    apply_stats = web.get("web:POST:runs", {})
    result = {
        "runs": count, "clients": clients, "seconds": elapsed, "runs_per_s": count / elapsed,
        "plan_p50_ms": statistics.median(plan_ms), "plan_p99_ms": pct(plan_ms, 99),
        "apply_p50_ms": statistics.median(apply_ms), "apply_p99_ms": pct(apply_ms, 99),
        "statements_per_plan": plan_stats.get("queries", 0) / max(plan_stats.get("calls", 1), 1),
        "statements_per_apply": apply_stats.get("queries", 0) / max(apply_stats.get("calls", 1), 1),
        "xacts_per_apply": apply_stats.get("xacts", 0) / max(apply_stats.get("calls", 1), 1),
        "errors": errors[:10], "error_count": len(errors), "web_counters": web,
        "web_rss_after": harness.tree_rss(session.procs["web"].pid),
    }
    result["table"] = table(
        f"submit: {count} runs (4 nodes) by {clients} HTTP clients, plan then apply, gunicorn 2x4",
        ["runs/s", "plan p50 ms", "plan p99 ms", "apply p50 ms", "apply p99 ms", "stmts/plan", "stmts/apply",
         "errors"],
        [[result["runs_per_s"], result["plan_p50_ms"], result["plan_p99_ms"], result["apply_p50_ms"],
          result["apply_p99_ms"], result["statements_per_plan"], result["statements_per_apply"], len(errors)]])
    return result
