"""submit: runs submitted over HTTP by concurrent clients, plan then apply, as the CLI does.

A real web process (gunicorn, 2 processes x 4 threads, bench.settings). Measures runs/s, p50/p99
of plan and of apply, and statements per request (counted in the web process by a bench-only
middleware).

Three kinds of row (`--placing both|yes|no`):
* placing: the workers and beat run behind the web on the same 2 CPUs, so the submitted runs are
  placed on a hollow fleet (and started, watched and ended) while the clients submit;
* placing, worker niced: the same with the worker at MUSTER_WORKER_NICE=10, as `muster serve`
  (web, worker and beat on one machine) runs it, so the web goes first when both want the CPU;
* web alone: the workers and beat are stopped first, as when they run on other machines; the runs
  wait in `submitted`, and at the end they are deleted and the queue purged (bench cleanup).
Placing costs the workers about 0.15 CPU-s per 4-node run (place scenario), so on 2 CPUs a submit
rate of 50 runs/s and the placing of those runs cannot both fit: the web-alone rows are the API's
own capacity, the placing rows what is left of it beside a busy engine.

One row per client count (`--clients 4,50`) and kind. The clients are the bench's own keep-alive threads or
Locust users (bench/locustfile.py, its own process); `--load-generator auto` takes the threads up to
4 clients and Locust above, where a Python thread pool in the driver would measure itself as much as
the web.
"""

from __future__ import annotations

import http.client
import importlib.util
import json
import statistics
import sys
import threading
import time
from importlib.metadata import version
from pathlib import Path

from bench import harness, instrument
from bench.hollow import make_hollow_fleet
from bench.scenarios.common import project_with_user, table, task_yaml

LOCUSTFILE = Path(__file__).resolve().parent.parent / "locustfile.py"
THREADS_UP_TO = 4  # --load-generator auto: the bench's own clients up to here, Locust above


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def ensure_web(session: harness.Session) -> int:
    if "web" not in session.procs:
        _, port = session.start_web()
        session.web_port = port  # type: ignore[attr-defined]
    return session.web_port  # type: ignore[attr-defined]


def generator_for(clients: int, choice: str) -> str:
    if choice == "auto":
        return "threads" if clients <= THREADS_UP_TO else "locust"
    return choice


def thread_clients(port: int, base: str, headers: dict, body: bytes, count: int, clients: int) -> dict:
    """The bench's own clients: one thread and one keep-alive connection each."""
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

    threads = [threading.Thread(target=client, args=(n,)) for n in per_client]
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"seconds": time.perf_counter() - t0, "runs": len(apply_ms), "plan_ms": plan_ms, "apply_ms": apply_ms,
            "errors": errors, "client_cpu_s": time.process_time() - cpu0, "load_generator": "threads"}


def locust_clients(session: harness.Session, port: int, base: str, headers: dict, body: bytes, count: int,
                   clients: int, timeout: float) -> dict:
    """Locust users in a process of their own; they stop after `count` runs or at `timeout` seconds."""
    spec = session.data_dir / f"locust-{clients}-spec.json"
    out = session.data_dir / f"locust-{clients}-out.json"
    out.unlink(missing_ok=True)
    spec.write_text(json.dumps({"base": base, "headers": headers, "body": body.decode(), "runs": count,
                                "out": str(out)}))
    name = f"locust{clients}"
    proc = session.start(name, [
        sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--only-summary",
        "--host", f"http://127.0.0.1:{port}", "--users", str(clients),
        "--spawn-rate", str(min(clients, 100)),  # Locust warns above 100/s; the users start together anyway
        "--run-time", f"{int(timeout)}s", "--loglevel", "WARNING", "--exit-code-on-error", "0",
        "--muster-spec", str(spec)])
    try:
        proc.wait(timeout=timeout + 60)
    finally:
        session.stop(name)
    if not out.exists():
        log = (session.data_dir / f"{name}.log").read_text(errors="replace")[-2000:]
        raise RuntimeError(f"locust wrote no results (exit {proc.returncode}):\n{log}")
    got = json.loads(out.read_text())
    return {"seconds": got["seconds"], "runs": got["runs"], "plan_ms": got["times_ms"].get("plan", []),
            "apply_ms": got["times_ms"].get("apply", []), "errors": got["errors"], "client_cpu_s": got["cpu_s"],
            "load_generator": f"locust {version('locust')}"}


def settle(project, timeout: float) -> float:
    """Let the previous row's runs end, so the next row's clients do not share the workers with them."""
    from runs.models import Run

    t = time.perf_counter()
    harness.wait_until(lambda: not Run.objects.filter(project=project).exclude(
        status__in=["done", "failed", "terminated"]).exists(), timeout, every=0.2)
    return time.perf_counter() - t


def one_row(session: harness.Session, args, port: int, count: int, clients: int, generator: str):
    project, user, token = project_with_user(f"submit-{clients}-{int(time.time())}")
    make_hollow_fleet(project, "hollow", count * 4)
    body = json.dumps({"configuration": task_yaml(4), "env": {}}).encode()
    headers = {"Authorization": f"Token {token}", "Content-Type": "application/json", "Accept": "application/json"}
    base = f"/api/projects/{project.name}/"
    warm = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    for _ in range(8):  # both gunicorn processes import the views and the configuration parser first
        warm.request("POST", base + "runs/plan", body=body, headers=headers)
        warm.getresponse().read()
    warm.close()
    r = session.redis()
    instrument.reset(r)
    if generator == "locust":
        got = locust_clients(session, port, base, headers, body, count, clients, args.timeout)
    else:
        got = thread_clients(port, base, headers, body, count, clients)
    web = {k: v for k, v in instrument.read(r).items() if k.startswith("web:")}
    plan_stats = web.get("web:POST:run-plan", {})
    apply_stats = web.get("web:POST:runs", {})
    plan_ms, apply_ms, errors = got["plan_ms"], got["apply_ms"], got["errors"]
    return {
        "runs": got["runs"], "clients": clients, "load_generator": got["load_generator"],
        "seconds": got["seconds"], "runs_per_s": got["runs"] / got["seconds"],
        "plan_p50_ms": statistics.median(plan_ms), "plan_p99_ms": pct(plan_ms, 99),
        "apply_p50_ms": statistics.median(apply_ms), "apply_p99_ms": pct(apply_ms, 99),
        "statements_per_plan": plan_stats.get("queries", 0) / max(plan_stats.get("calls", 1), 1),
        "statements_per_apply": apply_stats.get("queries", 0) / max(apply_stats.get("calls", 1), 1),
        "xacts_per_apply": apply_stats.get("xacts", 0) / max(apply_stats.get("calls", 1), 1),
        "client_cpu_s": got["client_cpu_s"],
        "errors": errors[:10], "error_count": len(errors), "web_counters": web,
    }, project


SERVE_NICE = 10  # what `muster serve` runs its worker at (muster/serve.py)


def stop_engine(session: harness.Session) -> None:
    for name in [n for n in session.procs if n.startswith("worker") or n == "beat"]:
        session.stop(name)
    session.worker_nice = None


def forget_unplaced(projects: list) -> int:
    """Bench cleanup after the web-alone rows: their runs were never meant to be placed."""
    from muster.celery import app
    from runs.models import Run

    Run.objects.filter(project__in=projects).delete()
    return app.control.purge()


def placing_label(row: dict) -> str:
    if not row["placing"]:
        return "no (web alone)"
    return "yes" if row["worker_nice"] is None else f"yes, worker nice {row['worker_nice']}"


def run(session: harness.Session, args) -> dict:
    count = args.runs or 200
    clients_list = args.clients if isinstance(args.clients, list) else [args.clients]
    choice = getattr(args, "load_generator", "auto")
    # (placing, worker niceness): a niceness of None leaves the worker as the environment says
    kinds = {"both": [(True, None), (True, SERVE_NICE), (False, None)], "yes": [(True, None), (True, SERVE_NICE)],
             "no": [(False, None)]}[getattr(args, "placing", "both")]
    if any(generator_for(c, choice) == "locust" for c in clients_list) and not importlib.util.find_spec("locust"):
        raise RuntimeError("locust is not installed: `make bench`, or .venv/bin/pip install -e '.[dev,bench]'")
    port = ensure_web(session)
    rows: list[dict] = []
    unplaced: list = []
    project = None
    for placing, nice in kinds:
        for clients in clients_list:
            settled = settle(project, args.timeout) if project is not None and project not in unplaced else 0.0
            if not placing or session.worker_nice != nice:
                stop_engine(session)  # after the previous rows' runs ended, so none is left half-way
            if placing and not any(n.startswith("worker") for n in session.procs):
                for i in range(args.workers):
                    session.start_worker(f"worker{i}", args.concurrency, nice=nice)
                session.worker_nice = nice
            if placing and "beat" not in session.procs:
                session.start_beat()
            row, project = one_row(session, args, port, count, clients, generator_for(clients, choice))
            row["settle_before_s"], row["placing"], row["worker_nice"] = settled, placing, nice
            rows.append(row)
            if not placing:
                unplaced.append(project)
    purged = forget_unplaced(unplaced) if unplaced else 0
    result = {"runs": count, "rows": rows, "web_rss_after": harness.tree_rss(session.procs["web"].pid),
              "purged_messages": purged}
    result["table"] = table(
        f"submit: {count} runs (4 nodes) per row, plan then apply, gunicorn 2x4; "
        "placing = workers placing the runs on the same CPUs meanwhile",
        ["clients", "load generator", "placing", "runs", "runs/s", "plan p50 ms", "plan p99 ms", "apply p50 ms",
         "apply p99 ms", "stmts/plan", "stmts/apply", "client CPU-s", "errors"],
        [[r["clients"], r["load_generator"], placing_label(r), r["runs"], r["runs_per_s"],
          r["plan_p50_ms"], r["plan_p99_ms"], r["apply_p50_ms"], r["apply_p99_ms"], r["statements_per_plan"],
          r["statements_per_apply"], r["client_cpu_s"], r["error_count"]] for r in rows])
    for r in rows[1:]:
        if r["settle_before_s"]:
            print(f"  ({r['clients']} clients: started after {r['settle_before_s']:.0f} s waiting for the previous "
                  "row's runs to end)", flush=True)
    return result
