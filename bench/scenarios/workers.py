"""workers: place at H=1,000 with 1, 2 and 4 Celery worker processes (each CONCURRENCY prefork
children), to see whether placement and the start of jobs scale with worker processes.

For each count the scenario stops the session's workers, starts that many fresh ones, and runs one
size of place (bench/scenarios/place.py: a hollow fleet of H, a burst of 4-node runs filling a
quarter of it). Figures per count: jobs placed/s, seconds to every job placed and `running`,
statements per job, worker CPU seconds per job (summed over all the worker processes). At the end
the session's usual workers (--workers x --concurrency) are started again for later scenarios.
"""

from __future__ import annotations

import time

from bench import harness
from bench.scenarios import place
from bench.scenarios.common import table

H = 1000
CONCURRENCY = 2


def _stop_workers(session: harness.Session) -> None:
    for name in [n for n in session.procs if n.startswith("worker")]:
        session.stop(name, grace=60)


def run(session: harness.Session, args) -> dict:
    counts = getattr(args, "worker_counts", None) or [1, 2, 4]
    if "beat" not in session.procs:
        session.start_beat()
    results = []
    for n in counts:
        _stop_workers(session)
        workers = [session.start_worker(f"worker{i}", CONCURRENCY) for i in range(n)]
        time.sleep(1)
        r = place.one_size(session, H, workers, timeout=args.timeout)
        r["workers"], r["concurrency"] = n, CONCURRENCY
        results.append(r)
        print(f"  {n} worker(s) x {CONCURRENCY}: {place.progress_line(r, args.timeout)}", flush=True)
        if not r["complete"]:
            place.abandon(session, workers, CONCURRENCY)
    _stop_workers(session)
    for i in range(args.workers):
        session.start_worker(f"worker{i}", args.concurrency)
    rows = [[r["workers"] if r["complete"] else f"{r['workers']}*", r["workers"] * r["concurrency"], r["jobs"],
             r["jobs_placed_per_s"], r["placed_s"] or "-", r["all_running_s"] or "-", r["finished_s"] or "-",
             r["statements_per_job"], r["xacts_per_job"], r["cpu_s_per_job"]] for r in results]
    text = table(f"workers: place at H={H} ({results[0]['runs']} runs x 4 nodes) by worker processes "
                 f"x {CONCURRENCY} prefork children",
                 ["workers", "children", "jobs", "jobs placed/s", "s to placed", "s to running", "s to done",
                  "stmts/job", "xacts/job", "worker CPU-s/job"], rows)
    return {"H": H, "concurrency": CONCURRENCY, "counts": results, "table": text}
