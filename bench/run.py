"""`make bench` / `python -m bench.run`: control-plane benchmarks on hollow instances.

    python -m bench.run [--scenario place|groups|no-capacity|submit|memory|limit|workers|e2e|start|recovery|sustain]
                        [--embedded] [--sizes 10,100,1000,10000] [--quick]

PostgreSQL + Redis by default (database muster_bench, created and dropped; Redis db 15), or the
embedded default (SQLite + filesystem broker) with --embedded. Real `celery worker` and `celery beat`
processes (DJANGO_SETTINGS_MODULE=bench.settings). Each scenario prints a table and writes
bench/results/<scenario>-<timestamp>.json. See bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from bench import harness

ORDER = ["place", "groups", "no-capacity", "submit", "memory", "limit", "workers", "e2e", "start", "recovery",
         "sustain"]
# run only when asked for (--scenario): half an hour at the default --sustain
ON_REQUEST = {"sustain"}
NOT_BUILT: dict[str, str] = {}
RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict:
    mem_kb = next(int(line.split()[1]) for line in open("/proc/meminfo") if line.startswith("MemTotal:"))

    def version(cmd: list[str]) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip()
        except OSError:
            return "?"

    return {"nproc": os.cpu_count(), "memory_gib": round(mem_kb / 2**20, 1), "python": platform.python_version(),
            "cpu": next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                         if line.startswith("model name")), "?"),
            "postgresql": version(["psql", "--version"]), "redis": version(["redis-server", "--version"])}


def save(name: str, payload: dict) -> Path:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(payload, indent=2, default=str))
    print(f"-> {path.relative_to(RESULTS.parent.parent)}", flush=True)
    return path


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenario", action="append", choices=[*ORDER, *NOT_BUILT],
                   help="run only these (repeatable); default: all, in order")
    p.add_argument("--embedded", action="store_true", help="SQLite + filesystem broker instead of PostgreSQL + Redis")
    p.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], help="place, groups: fleet sizes H")
    p.add_argument("--quick", action="store_true", help="smaller sizes (place up to H=1000)")
    p.add_argument("--workers", type=int, default=1, help="celery worker processes")
    p.add_argument("--concurrency", type=int, default=4, help="prefork children per worker")
    p.add_argument("--runs", type=int, default=None,
                   help="no-capacity/submit: runs (default 200); groups: runs per size (5); e2e: runs (20)")
    p.add_argument("--worker-counts", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4],
                   help="workers: worker process counts to compare (1,2,4)")
    p.add_argument("--clients", type=lambda s: [int(x) for x in s.split(",")], default=[4, 50],
                   help="submit: concurrent HTTP clients, one row each (4,50)")
    p.add_argument("--placing", choices=["both", "yes", "no"], default="both",
                   help="submit: rows with the workers placing the runs meanwhile, at normal priority and "
                        "at MUSTER_WORKER_NICE=10 (yes), with the web alone (no: workers and beat stopped), "
                        "or all of them (both)")
    p.add_argument("--load-generator", choices=["auto", "threads", "locust"], default="auto",
                   help="submit: the bench's own keep-alive threads, or Locust (bench/locustfile.py); "
                        "auto: threads up to 4 clients, Locust above")
    p.add_argument("--sustain", type=float, default=300,
                   help="sustain: seconds of bursts per row (300); rows are --sizes (1000,10000) x --worker-counts")
    p.add_argument("--timeout", type=float, default=240, help="cap per measurement, seconds")
    p.add_argument("--reps", type=int, default=5, help="start: timed starts of each process (after a throwaway one)")
    p.add_argument("--kills", type=int, default=3, help="recovery: worker kills, one after another")
    p.add_argument("--lease-seconds", type=float, default=None,
                   help="recovery: what-if lease for its workers (default: the product's MUSTER_LEASE_SECONDS)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    wanted = args.scenario or [s for s in ORDER if s not in ON_REQUEST]
    for name in wanted:
        if name in NOT_BUILT:
            print(f"scenario {name}: skipped: {NOT_BUILT[name]}")
    wanted = [s for s in ORDER if s in wanted]
    session = harness.Session(embedded=args.embedded)
    info = machine()
    print(f"Muster control-plane bench, session {session.id}")
    print(f"machine: {info['nproc']} CPUs ({info['cpu']}), {info['memory_gib']} GiB; {info['postgresql']}; "
          f"{info['redis']}")
    print(f"store: {session.describe()}; workers {args.workers} x concurrency {args.concurrency}; "
          f"data dir {session.data_dir}", flush=True)
    code = 0
    context: dict = {"machine": info, "store": session.describe(), "args": vars(args)}
    try:
        session.setup()
        from bench.scenarios import (
            e2e,
            groups,
            limit,
            memory,
            no_capacity,
            place,
            recovery,
            start,
            submit,
            sustain,
            workers,
        )

        modules = {"place": place, "groups": groups, "no-capacity": no_capacity, "submit": submit, "memory": memory,
                   "limit": limit, "workers": workers, "e2e": e2e, "start": start, "recovery": recovery,
                   "sustain": sustain}
        for name in wanted:
            if name == "limit" and args.embedded:
                print("scenario limit: skipped with --embedded (pgbench and redis-benchmark measure the servers)")
                continue
            t = time.time()
            try:
                result = modules[name].run(session, args, context) if name in ("memory", "limit") \
                    else modules[name].run(session, args)
            except Exception as exc:  # noqa: BLE001 - report and go on with the next scenario
                import traceback

                traceback.print_exc()
                print(f"scenario {name}: FAILED: {exc}", flush=True)
                code = 1
                continue
            context[name] = result
            save(name, {"scenario": name, "machine": info, "store": session.describe(), "args": vars(args),
                        "seconds": time.time() - t, "result": result})
    finally:
        leftovers = session.teardown()
        print(f"cleanup: processes left after stop: {len(leftovers)}; database and data dir removed", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
