"""limit: what the servers themselves can do on this machine, and the ceiling that implies.

pgbench simple-update (-N) TPS on a scratch database, and redis-benchmark SET/GET ops/s against a
private redis-server on a spare port (the machine's shared Redis is not loaded). With the counted
transactions and Redis commands per job of `place` (largest complete H), the ceilings are
TPS / xacts-per-job and ops/s / redis-commands-per-job jobs/s; Muster's measured rate is given as a
fraction of the lower one.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import time

from bench import harness
from bench.scenarios.common import table

SCRATCH = "muster_bench_pgbench"


def pgbench(seconds: int, clients: int) -> float:
    url = harness.PG
    host = re.search(r"@([^:/]+)", url).group(1)
    port = (re.search(r":(\d+)$", url) or re.search(r":(\d+)/", url))
    args = ["-h", host, "-U", "postgres"] + (["-p", port.group(1)] if port else [])
    subprocess.run(["psql", *args, "-qc", f'DROP DATABASE IF EXISTS "{SCRATCH}"'], check=True, capture_output=True)
    subprocess.run(["psql", *args, "-qc", f'CREATE DATABASE "{SCRATCH}"'], check=True, capture_output=True)
    try:
        subprocess.run(["pgbench", *args, "-i", "-s", "10", "-q", SCRATCH], check=True, capture_output=True)
        out = subprocess.run(["pgbench", *args, "-N", "-T", str(seconds), "-c", str(clients), "-j", "2", SCRATCH],
                             check=True, capture_output=True, text=True).stdout
    finally:
        subprocess.run(["psql", *args, "-qc", f'DROP DATABASE IF EXISTS "{SCRATCH}"'], capture_output=True)
    return float(re.search(r"tps = ([\d.]+)", out).group(1))


def redis_benchmark(session: harness.Session) -> dict[str, float]:
    port = harness.free_port()
    workdir = tempfile.mkdtemp(prefix="bench-redis-")
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", workdir], stdout=subprocess.DEVNULL,
                            env={**os.environ, "BENCH_SESSION": session.id}, start_new_session=True)
    try:
        harness.wait_until(lambda: subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True,
                                                  text=True).stdout.strip() == "PONG", 10)
        out = subprocess.run(["redis-benchmark", "-p", str(port), "-q", "-n", "100000", "-t", "set,get"],
                             capture_output=True, text=True, check=True).stdout
    finally:
        proc.terminate()
        proc.wait(10)
    found = {}
    for line in out.replace("\r", "\n").splitlines():
        m = re.match(r"(SET|GET): ([\d.]+) requests per second", line.strip())
        if m:
            found[m.group(1)] = float(m.group(2))
    return found


def run(session: harness.Session, args, context: dict) -> dict:
    t = time.time()
    tps = pgbench(10, 8)
    rb = redis_benchmark(session)
    place = context.get("place")
    if place is None:  # run alone: use the latest saved place figures
        import glob
        import json

        files = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "results", "place-*.json")))
        place = json.load(open(files[-1]))["result"] if files else None
    rows, result = [], {"pgbench_tps": tps, "redis_ops_per_s": rb, "seconds": time.time() - t}
    if place:
        complete = [s for s in place["sizes"] if s["complete"]] or place["sizes"]
        ref = complete[-1]
        xacts = ref["xacts_per_job"]
        cmds = ref["redis_commands_per_job"]
        pg_ceiling = tps / xacts
        redis_ceiling = min(rb.values()) / cmds if rb and cmds else float("inf")
        ceiling = min(pg_ceiling, redis_ceiling)
        measured = ref.get("jobs_finished_per_s") or ref["jobs_placed_per_s"]  # whole lives, like xacts/job
        result.update(reference_H=ref["H"], xacts_per_job=xacts, redis_commands_per_job=cmds,
                      pg_ceiling_jobs_per_s=pg_ceiling, redis_ceiling_jobs_per_s=redis_ceiling,
                      measured_jobs_per_s=measured, fraction_of_ceiling=measured / ceiling)
        rows.append([tps, rb.get("SET", 0.0), rb.get("GET", 0.0), f"{ref['H']}", xacts, cmds, pg_ceiling,
                     redis_ceiling, measured, measured / ceiling])
    else:
        rows.append([tps, rb.get("SET", 0.0), rb.get("GET", 0.0), "-", "-", "-", "-", "-", "-", "-"])
    result["table"] = table(
        "limit: server ceilings (pgbench -N 10 s x 8 clients; redis-benchmark -n 100000 on a private redis-server)",
        ["pg TPS", "redis SET/s", "redis GET/s", "ref H", "xacts/job", "redis cmds/job", "pg ceiling jobs/s",
         "redis ceiling jobs/s", "Muster jobs/s (submit->done)", "fraction"], rows)
    return result
