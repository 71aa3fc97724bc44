"""`make bench-peer` / `python -m bench.peer.run`: Muster and dstack 0.22.5 side by side, one run.

    python -m bench.peer.run [--submit-runs 100] [--clients 4] [--nocap-runs 100] [--sizes 100,1000]
                             [--rounds 1] [--skip-placement] [--place-jobs 100]

Muster: the bench harness's (PostgreSQL database muster_bench_peer, Redis db 13, gunicorn 2 x 4,
one worker x 4 children (at normal priority unless --worker-nice), beat; hollow instances). dstack: its
server from .venv-peer on its own SQLite in a scratch dir. Each workload runs on both, one system
after the other, the order swapped every round, so the machine's load falls on both. Prints both
columns and the ratio per figure with the load average, and writes bench/results/peer-<time>.json.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from bench import harness
from bench.peer import dstack_api as dstack
from bench.peer import targets
from bench.peer.workloads import clients, warm
from bench.run import machine, save

FIGURES = [  # (key, label, higher is better)
    ("submit_runs_per_s", "submit, runs/s (plan + apply)", True),
    ("plan_p50_ms", "plan p50 ms", False), ("plan_p99_ms", "plan p99 ms", False),
    ("apply_p50_ms", "apply p50 ms", False), ("apply_p99_ms", "apply p99 ms", False),
    ("nocap_runs_per_s", "no capacity, runs/s to terminal", True),
]


def loadavg() -> str:
    return " ".join(open("/proc/loadavg").read().split()[:3])


def submit(system, args) -> dict:
    warm(system.target)
    got = clients(system.target, args.submit_runs, args.clients)
    got["load_after"] = loadavg()
    return got


def no_capacity(system, args) -> dict:
    target = system.nocap_target()
    got = clients(target, args.nocap_runs, args.clients, plan=False)
    ended = harness.wait_until(lambda: system.terminal(got["names"]) >= len(got["names"]), args.timeout, every=0.2)
    seconds = time.perf_counter() - got["started_at"]
    # submit_s: the applies alone; the rest of `seconds` is the tail after the last apply was answered
    return {"runs": got["runs"], "seconds": seconds, "submit_s": got["seconds"], "complete": bool(ended),
            "runs_per_s": got["runs"] / seconds if ended else 0.0, "errors": got["errors"],
            "error_count": got["error_count"], "load_after": loadavg()}


def placement_runs(hosts: int, least_jobs: int) -> int:
    """4-node runs for H hosts: a quarter of the hosts (as bench/scenarios/place.py), but at least
    `least_jobs` jobs and at most every host. Fewer (H/16 runs: 24 jobs at 100 hosts) measured how
    soon dstack's interval-driven pipeline wakes rather than how fast it places."""
    return max(1, min(hosts // 4, max(hosts // 16, -(-least_jobs // 4))))


def placement(system, args, hosts: int) -> dict:
    target = system.placement_target(hosts)
    runs = placement_runs(hosts, args.place_jobs)
    got = clients(target, runs, min(args.clients, runs), plan=False)
    jobs = len(got["names"]) * 4  # the runs an apply was answered for
    first: dict = {}

    def all_placed() -> bool:
        n = system.placed(got["names"])
        if n and not first:
            first.update(at=time.perf_counter(), count=n)
        return n >= jobs

    # every 20 ms: at 100 hosts Muster places in a few tenths of a second, which 0.1 s polls would round up
    placed = harness.wait_until(all_placed, args.timeout, every=0.02)
    ended = time.perf_counter()
    seconds = ended - got["started_at"]
    result_placed = system.placed(got["names"])
    check = system.placement_check(got["names"])
    system.let_go(got["names"])  # dstack's never end on hosts that do not exist; the next step must not share them
    done = jobs if placed else result_placed
    # after the first job was seen on a host: the pace of placing itself, without the wait for the
    # pipeline to pick the first run up (dstack's is interval-driven; Muster's starts at the apply)
    after = ended - first["at"] if first else None
    return {"hosts": hosts, "runs": runs, "jobs": jobs, "complete": bool(placed), "seconds": seconds,
            # cut short: the rate of what was placed by the cap, marked as such in the table
            "jobs_per_s": done / seconds, "placed": result_placed,
            "first_placed_s": first["at"] - got["started_at"] if first else None,
            "jobs_per_s_after_first": (done - first["count"]) / after if after else None,
            "errors": got["errors"], "error_count": got["error_count"], "load_after": loadavg(), **check}


def ratio(d, m, higher_better: bool) -> str:
    if not d or not m:
        return "-"
    return f"{(m / d if higher_better else d / m):.1f}x"


def print_table(results: dict) -> str:
    rows = []
    for key, label, hb in FIGURES:
        d, m = results["dstack"].get(key), results["muster"].get(key)
        rows.append((label, d, m, ratio(d, m, hb)))
    for hosts in results["sizes"]:
        d, m = results["dstack"].get(f"place_{hosts}"), results["muster"].get(f"place_{hosts}")
        cut = [f"{n}: {results[n][f'place_{hosts}_cut']}" for n in ("dstack", "muster")
               if results[n].get(f"place_{hosts}_cut")]
        jobs = results.get("placement_jobs", {}).get(hosts)
        label = (f"placement, jobs/s from the first apply, {jobs} jobs on {hosts} idle hosts"
                 + (f" (cut short: {'; '.join(cut)})" if cut else ""))
        rows.append((label, d, m, ratio(d, m, True)))
        d, m = results["dstack"].get(f"place_{hosts}_after"), results["muster"].get(f"place_{hosts}_after")
        rows.append((f"placement, jobs/s after the first job placed, {hosts} idle hosts", d, m, ratio(d, m, True)))
        d, m = results["dstack"].get(f"place_{hosts}_first"), results["muster"].get(f"place_{hosts}_first")
        rows.append((f"placement, seconds from the first apply to the first job placed, {hosts} idle hosts",
                     d, m, ratio(d, m, False)))
    fmt = lambda v: "-" if v is None else (f"{v:,.0f}" if v >= 100 else f"{v:.2f}")  # noqa: E731
    lines = ["| figure | dstack 0.22.5 | Muster | ratio (Muster ahead) |", "|---|---|---|---|"]
    lines += [f"| {label} | {fmt(d)} | {fmt(m)} | {r} |" for label, d, m, r in rows]
    text = "\n".join(lines)
    print("\n" + text, flush=True)
    return text


def parse(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.peer.run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--submit-runs", type=int, default=100)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--nocap-runs", type=int, default=100)
    p.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[100, 1000])
    p.add_argument("--rounds", type=int, default=1, help="each workload this many times on each system")
    p.add_argument("--skip-placement", action="store_true")
    p.add_argument("--place-jobs", type=int, default=100,
                   help="placement: at least this many jobs (4-node runs) per size, H/16 runs when more, "
                        "at most every host (100: 25 runs at 100 hosts, 62 at 1,000)")
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--settle", type=float, default=120,
                   help="before each step, wait up to this long for the system's earlier runs to end")
    p.add_argument("--worker-nice", type=int, default=None,
                   help="MUSTER_WORKER_NICE for Muster's worker (default: unset, the priority dstack's server "
                        "runs its scheduler at; `muster serve` uses 10)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    os.environ.setdefault("BENCH_DB_NAME", "muster_bench_peer")
    os.environ.setdefault("BENCH_REDIS_DB", "13")
    session = harness.Session(count=False)  # as `muster serve` runs: dstack counts nothing either
    info = machine()
    nice = "unset" if args.worker_nice is None else args.worker_nice
    print(f"bench-peer: Muster (PostgreSQL + Redis, gunicorn 2x4, worker 1x4, MUSTER_WORKER_NICE {nice}, "
          "no statement counting) against dstack "
          f"{dstack.VERSION} (SQLite); {info['nproc']} CPUs ({info['cpu']}); load average {loadavg()}; "
          "the machine is shared, so the absolute figures move with its load, the ratios less", flush=True)
    per: dict = {"dstack": {"runs": []}, "muster": {"runs": []}}
    sizes = [] if args.skip_placement else args.sizes
    try:
        session.setup()
        systems = {"muster": targets.Muster(session, args.worker_nice), "dstack": targets.Dstack(session)}
        for s in systems.values():
            s.start()
        steps = [("submit", submit), ("no-capacity", no_capacity)]
        steps += [(f"place-{h}", lambda s, a, h=h: placement(s, a, h)) for h in sizes]
        i = 0
        for rnd in range(args.rounds):
            for step, fn in steps:
                order = ["dstack", "muster"] if i % 2 == 0 else ["muster", "dstack"]
                i += 1
                for name in order:
                    # Every system's earlier runs first, not only this one's: the other server's tail
                    # (dstack fails its 100 submitted runs over about 30 s after its submit step) would
                    # take the CPU of this step as much as this system's own tail would.
                    t = time.perf_counter()
                    harness.wait_until(lambda: all(s.unfinished() == 0 for s in systems.values()), args.settle,
                                       every=0.5)
                    waited = time.perf_counter() - t
                    left = {n: s.unfinished() for n, s in systems.items()}
                    print(f"[round {rnd + 1}] {step} on {name} (load average {loadavg()}; waited {waited:.0f} s "
                          f"for earlier runs to end, not ended: {left})", flush=True)
                    try:
                        got = fn(systems[name], args)
                        got.update(settle_s=waited, earlier_runs_not_ended=left)
                    except Exception as exc:  # noqa: BLE001 - report it, go on with the other system
                        got = {"failed": str(exc)[:2000]}
                    print(f"   {({k: v for k, v in got.items() if k not in ('names',)})}", flush=True)
                    per[name]["runs"].append({"round": rnd + 1, "step": step, **got})
        for name in per:
            best = per[name]
            for entry in best["runs"]:
                step = entry["step"]
                if "failed" in entry or not entry.get("runs"):
                    continue
                if step == "submit":
                    for k in ("runs_per_s", "plan_p50_ms", "plan_p99_ms", "apply_p50_ms", "apply_p99_ms"):
                        best.setdefault("submit_" + k if k == "runs_per_s" else k, []).append(entry.get(k))
                elif step == "no-capacity" and entry["complete"]:
                    best.setdefault("nocap_runs_per_s", []).append(entry["runs_per_s"])
                elif step.startswith("place-"):
                    best.setdefault(f"place_{entry['hosts']}", []).append(entry["jobs_per_s"])
                    best.setdefault(f"place_{entry['hosts']}_after", []).append(entry.get("jobs_per_s_after_first"))
                    best.setdefault(f"place_{entry['hosts']}_first", []).append(entry.get("first_placed_s"))
                    if not entry["complete"]:
                        best[f"place_{entry['hosts']}_cut"] = f"{entry['placed']} of {entry['jobs']} placed by the cap"

            for k, v in list(best.items()):
                if k != "runs" and isinstance(v, list):
                    vals = sorted(x for x in v if x is not None)
                    best[k] = vals[len(vals) // 2] if vals else None  # median over the rounds
        per["sizes"] = sizes
        per["placement_jobs"] = {h: 4 * placement_runs(h, args.place_jobs) for h in sizes}
        per["table"] = print_table(per)
        per["load_average_end"] = loadavg()
        print(f"load average at the end: {per['load_average_end']} on {info['nproc']} CPUs", flush=True)
        save("peer", {"scenario": "peer", "machine": info, "args": vars(args), "result": per})
    finally:
        leftovers = session.teardown()
        print(f"cleanup: processes left after stop: {len(leftovers)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
