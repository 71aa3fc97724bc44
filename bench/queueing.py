"""`python -m bench.queueing`: who gets a freed host, and how soon, with a deep queue (issue 43, item 5).

    python -m bench.queueing [--hosts 1000] [--depth 10000] [--projects 3] [--bursts 10] [--burst 100]
                             [--workers 1] [--concurrency 4] [--shared] [--timeout 120] [--no-analyze]

A fleet of --hosts hollow hosts (bench/hollow.py), every host busy with a 1-node run that never ends
on its own; then --depth waiting runs (1-node tasks, `retry: {on_events: [no-capacity], duration:
1d}`, priorities 10, 50 and 90 in turn) over --projects projects, all submitted through the
product's submit path and each told by the real worker that its fleet is full. Then --bursts
bursts of --burst running jobs ended (their hollow runner reports them `done`; the beat's watch
sees it and the worker ends them and gives their hosts back), spread over the projects, each
burst after the previous one drained. The real Celery worker(s) and beat do all the engine's work.

By default each project has a fleet of its own (hosts / projects). `--shared`: one fleet of all
the hosts owned by the first project with `shared_with` the others (quota hosts / projects each),
their runs naming it `fleets: [owner/pool]`; this needs shared fleets (instances.FleetShare,
issue 43 item 2) and says so when they are missing.

Figures per burst and overall: admissions per second while a burst drains (jobs placed / seconds
from the burst's first release to its last placement), release-to-placed seconds per freed host
(the old job's end write, its `done` event, to the next job's `provisioning` event on that host:
p50 / p95 / p99), the queue depth, the worker count, the load average, and statements and worker
CPU-seconds per admission (bench/instrument.py, by task). Checked inside the bench (exit 1 when one
fails): every freed host placed again exactly once, every run placed at most once (no run with two
jobs on hosts), no host held by two active jobs (sampled every 0.25 s, and from the events at the
end), the queue shorter by exactly the jobs placed. Aims (issue 43): >= 100 admissions/s and a
release-to-placed p99 <= 1 s at depth 10,000 on 2 cores. JSON in bench/results/queueing-<time>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

from bench import harness
from bench.run import machine, save

PRIORITIES = (10, 50, 90)
FOREVER = 30 * 86400  # hollow run seconds: a job ends only when the bench ends it
AIM_RATE, AIM_P99 = 100.0, 1.0
WOKEN_S = 5.0


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.queueing", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hosts", type=int, default=1000)
    p.add_argument("--depth", type=int, default=10000, help="runs waiting for a host when the bursts start")
    p.add_argument("--projects", type=int, default=3)
    p.add_argument("--bursts", type=int, default=10)
    p.add_argument("--burst", type=int, default=100, help="jobs ended per burst")
    p.add_argument("--workers", type=int, default=1, help="celery worker processes")
    p.add_argument("--concurrency", type=int, default=4, help="prefork children per worker")
    p.add_argument("--shared", action="store_true", help="one fleet shared between the projects (shared_with)")
    p.add_argument("--timeout", type=float, default=120, help="cap per burst to drain, seconds")
    p.add_argument("--no-analyze", dest="analyze", action="store_false",
                   help="leave the planner's statistics as the loading left them (see --help)")
    return p.parse_args(argv)


def pct(values: list[float], q: float) -> float | None:
    """Nearest rank."""
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(q * len(s) + 0.5)) - 1))]


def task(priority: int, fleet: str | None) -> str:
    lines = ["type: task", "commands: [echo]", f"priority: {priority}",
             "retry: {on_events: [no-capacity], duration: 1d}"]
    if fleet:
        lines.append(f"fleets: [{fleet}]")
    return "\n".join(lines) + "\n"


def make_fleets(projects: list, hosts: int, shared: bool) -> list[str | None]:
    """The fleets, and for each project what its runs name in `fleets:` (None: its own fleet)."""
    from bench.hollow import make_hollow_fleet

    if not shared:
        sizes = [hosts // len(projects) + (1 if i < hosts % len(projects) else 0) for i in range(len(projects))]
        for (project, _), size in zip(projects, sizes, strict=True):
            make_hollow_fleet(project, "pool", size, placement="any")
        return [None] * len(projects)
    from instances import models as instance_models

    share_model = getattr(instance_models, "FleetShare", None)
    if share_model is None:
        sys.exit("--shared: this branch has no shared fleets (instances.FleetShare, issue 43 item 2); "
                 "run without --shared (a fleet per project) or on a branch with them merged")
    owner = projects[0][0]
    quota = hosts // len(projects)
    fleet = make_hollow_fleet(owner, "pool", hosts, placement="any")
    fleet.configuration = {**fleet.configuration, "quota": {"hosts": hosts - quota * (len(projects) - 1)},
                           "shared_with": [{"project": p.name, "quota": {"hosts": quota}} for p, _ in projects[1:]]}
    fleet.save(update_fields=["configuration"])
    for i, (project, _) in enumerate(projects):
        share_model.objects.create(fleet=fleet, project=project,
                                   hosts=fleet.configuration["quota"]["hosts"] if i == 0 else quota)
    return [None] + [f"{owner.name}/pool"] * (len(projects) - 1)


def planner_statistics(analyze: bool) -> str:
    """ANALYZE once the queue is loaded, as autovacuum would within its naptime on a server with
    PostgreSQL's defaults. Where autovacuum is off (as on the bench machines) the planner otherwise
    keeps the estimates of the empty tables: it reads the 11,000 jobs' status index per host in a
    nested loop and every project's waiting jobs for one project's page (docs/performance.md)."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return connection.vendor
    with connection.cursor() as cursor:
        cursor.execute("SHOW autovacuum")
        autovacuum = cursor.fetchone()[0]
        if analyze:
            cursor.execute("ANALYZE")
    return f"autovacuum {autovacuum}; " + ("ANALYZE every 30 s while loading and once the queue was loaded"
                                            if analyze else "not analyzed (--no-analyze)")


def analyzing(stop: threading.Event, every: float = 30.0) -> threading.Thread | None:
    """ANALYZE every `every` seconds while the fleet and the queue fill, as autovacuum would: with
    the empty tables' estimates, a shared fleet's quota read (instances/rows.held) took 0.8 s a call
    at 2,000 waiting runs and the queue filled at 110 runs a minute."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return None

    def loop() -> None:
        try:
            while not stop.wait(every):
                with connection.cursor() as cursor:
                    cursor.execute("ANALYZE")
        finally:
            connection.close()

    thread = threading.Thread(target=loop, name="analyze", daemon=True)
    thread.start()
    return thread


def submit(projects, names, count: int, priority_of) -> list[int]:
    from runs.services.submission import submit_run

    ids = []
    for i in range(count):
        k = i % len(projects)
        (project, user), fleet = projects[k], names[k]
        ids.append(submit_run(project, user, {"configuration": task(priority_of(i), fleet)}).pk)
    return ids


def end_jobs(job_ids: list[int]) -> float:
    """Their hollow runners report them done from now on (the state file's start time moved back)."""
    from bench.hollow import state_dir
    from runs.models import Job

    t = time.time()
    for instance_id in Job.objects.filter(pk__in=job_ids).values_list("instance_id", flat=True):
        path = state_dir() / f"{instance_id}.json"
        jobs = json.loads(path.read_text())
        tmp = path.with_suffix(".bench.tmp")
        tmp.write_text(json.dumps({k: 0.0 for k in jobs}))
        os.replace(tmp, path)
    return t


def event_times(job_ids: list[int], statuses) -> dict[int, float]:
    from events.models import Event

    rows = Event.objects.filter(job_id__in=job_ids, status__in=list(statuses)).values_list("job_id", "created")
    out: dict[int, float] = {}
    for job_id, created in rows:
        out[job_id] = min(out.get(job_id, created.timestamp()), created.timestamp())
    return out


def one_burst(project_ids, held: list[int], size: int, timeout: float, backlog) -> dict:
    """End `size` of the running jobs in `held` (spread over the projects), wait until each freed host
    has its next job; the figures of that burst."""
    from runs.choices import JOB_FINISHED
    from runs.models import Job

    by_project: dict[int, list[int]] = {}
    # running on its host (its hollow state written): a job still starting cannot be ended yet
    for job_id, project_id in (Job.objects.filter(pk__in=held, status="running", runner_submitted=True)
                               .order_by("pk").values_list("pk", "run__project_id")):
        by_project.setdefault(project_id, []).append(job_id)
    chosen: list[int] = []
    while len(chosen) < size and any(by_project.values()):
        for pid in project_ids:
            if by_project.get(pid) and len(chosen) < size:
                chosen.append(by_project[pid].pop())
    instances = dict(Job.objects.filter(pk__in=chosen).values_list("pk", "instance_id"))
    freed = set(instances.values())
    before = list(Job.objects.filter(instance_id__in=freed).values_list("pk", flat=True))
    load0, backlog0 = os.getloadavg(), backlog()
    ended_at = end_jobs(chosen)
    following = Job.objects.filter(instance_id__in=freed).exclude(pk__in=before)
    done = harness.wait_until(lambda: following.count() >= len(freed), timeout, every=0.05)
    drained_at = time.time()
    time.sleep(0.5)  # a second job on a freed host would show up now
    load1 = os.getloadavg()
    new = dict(following.values_list("pk", "instance_id"))
    released = event_times(chosen, JOB_FINISHED)
    placed = event_times(list(new), ["provisioning"])
    per_host = {}
    for job_id, instance_id in new.items():
        old = next(j for j, i in instances.items() if i == instance_id)
        if job_id in placed and old in released:
            per_host.setdefault(instance_id, []).append(placed[job_id] - released[old])
    delays = [v[0] for v in per_host.values()]
    first_release = min(released.values(), default=ended_at)
    last_placed = max(placed.values(), default=drained_at)
    span = max(last_placed - first_release, 1e-6)
    # the wakes' share: placed within WOKEN_S of the release (the rest waited for the sweep's recheck)
    woken = [placed[j] for j, i in new.items() if j in placed and per_host.get(i) and per_host[i][0] <= WOKEN_S]
    woken_span = max(max(woken, default=first_release) - first_release, 1e-6)
    return {
        "ended": len(chosen), "hosts_freed": len(freed), "placed": len(new), "complete": bool(done),
        "hosts_given_twice_in_burst": sum(1 for v in per_host.values() if len(v) > 1),
        "admissions_per_s": len(new) / span, "drain_s": span,
        "woken": len(woken), "woken_per_s": len(woken) / woken_span,
        "detect_s": first_release - ended_at,  # watch poll: the bench's end to the engine's end write
        "release_to_placed": delays, "p50": pct(delays, 0.5), "p95": pct(delays, 0.95), "p99": pct(delays, 0.99),
        "max": max(delays, default=None), "load": [round(x, 2) for x in (*load0, *load1)],
        "broker_backlog": [backlog0, backlog()],  # messages waiting in the broker at the start and the end
        "new_jobs": list(new), "chosen": chosen,
    }


def sampler(project_ids, doubles: list, stop: threading.Event) -> threading.Thread:
    from django.db import connection
    from django.db.models import Count

    from runs.choices import JOB_ACTIVE
    from runs.models import Job

    def sample() -> None:
        try:
            while not stop.wait(0.25):
                held = (Job.objects.filter(run__project_id__in=project_ids, status__in=JOB_ACTIVE,
                                           instance__isnull=False)
                        .values("instance_id").annotate(n=Count("id")).filter(n__gt=1))
                doubles.extend(f"instance {r['instance_id']} held by {r['n']} active jobs" for r in held)
        finally:
            connection.close()

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    return thread


def main(argv=None) -> int:
    args = parse(argv)
    os.environ.setdefault("BENCH_DB_NAME", "muster_bench_queueing")
    per_project = -(-args.depth // args.projects) + args.hosts
    session = harness.Session(extra_env={
        "BENCH_HOLLOW_RUN_SECONDS": str(FOREVER),
        # the product's watch interval (bench.settings' 0.5 s would poll 1,000 busy hosts twice a second)
        "BENCH_POLL_INTERVAL": os.environ.get("BENCH_POLL_INTERVAL", "1.0"),
        # the product's caps (1,000 waiting runs a project) are below this depth: raised, not off
        "MUSTER_MAX_WAITING_RUNS_PER_PROJECT": str(per_project),
        "MUSTER_MAX_ACTIVE_RUNS_PER_PROJECT": str(per_project + args.hosts)})
    info = machine()
    print(f"queueing bench, session {session.id}: {args.hosts} hosts, depth {args.depth} over {args.projects} "
          f"projects ({'one shared fleet' if args.shared else 'a fleet each'}), {args.bursts} bursts of "
          f"{args.burst}; {args.workers} worker(s) x {args.concurrency}; {info['nproc']} CPUs; "
          f"load {os.getloadavg()}", flush=True)
    code = 0
    try:
        session.setup()
        code = measure(session, args, info)
    finally:
        leftovers = session.teardown()
        print(f"cleanup: processes left after stop: {len(leftovers)}; database and data dir removed", flush=True)
    return code


def measure(session: harness.Session, args, info: dict) -> int:
    from django.db.models import Count

    from bench.scenarios.common import Meter, project_with_user, table
    from bench.scenarios.sustain import double_placements
    from runs.models import Job, Run
    from runs.queue import waiting_jobs

    t0 = time.time()
    projects = [project_with_user(f"team-{chr(97 + i)}")[:2] for i in range(args.projects)]
    project_ids = [p.pk for p, _ in projects]
    names = make_fleets(projects, args.hosts, args.shared)
    workers = [session.start_worker(f"worker{i}", args.concurrency) for i in range(args.workers)]
    session.start_beat()
    loaded = threading.Event()
    analyzer = analyzing(loaded) if args.analyze else None
    placed = Job.objects.filter(run__project_id__in=project_ids, instance__isnull=False)
    # fill the fleet: one run per host (priority 50), every job on a host and running
    holders = submit(projects, names, args.hosts, lambda i: 50)
    filled = harness.wait_until(lambda: Job.objects.filter(run_id__in=holders, status="running").count()
                                >= args.hosts, 600, every=1)
    print(f"fleet busy: {placed.count()} jobs on hosts in {time.time() - t0:.0f} s ({'ok' if filled else 'NOT ALL'})",
          flush=True)

    def depth() -> int:
        return sum(waiting_jobs(pid).count() for pid in project_ids)

    t1 = time.time()
    waiting_ids = submit(projects, names, args.depth, lambda i: PRIORITIES[(i // args.projects) % len(PRIORITIES)])
    submitted_s = time.time() - t1
    harness.wait_until(lambda: depth() >= args.depth, 1500, every=5)
    loaded.set()
    if analyzer is not None:
        analyzer.join(60)
    queue_depth = depth()
    print(f"queue: {queue_depth} runs waiting ({args.depth} submitted in {submitted_s:.0f} s, waiting after "
          f"{time.time() - t1:.0f} s); load {os.getloadavg()}", flush=True)
    print(f"planner statistics: {planner_statistics(args.analyze)}", flush=True)
    doubles: list[str] = []
    stop = threading.Event()
    thread = sampler(project_ids, doubles, stop)
    meter = Meter(session, [w.pid for w in workers])
    meter.start()
    broker = session.redis()
    held = list(Job.objects.filter(run_id__in=holders, status="running").values_list("pk", flat=True))
    bursts = []
    for b in range(args.bursts):
        time.sleep(1.0)  # the previous burst's tail (its placed jobs start) out of this one's way
        r = one_burst(project_ids, held, args.burst, args.timeout, lambda: broker.llen("celery"))
        bursts.append(r)
        held = [j for j in held if j not in set(r["chosen"])] + r["new_jobs"]
        print(f"  burst {b + 1}: {r['placed']}/{r['hosts_freed']} placed, {r['admissions_per_s']:.1f} admissions/s, "
              f"release-to-placed p50 {r['p50']} p99 {r['p99']} s, detect {r['detect_s']:.2f} s, load {r['load']}",
              flush=True)
    measured = meter.stop(pg_settle=0)
    stop.set()
    thread.join(5)
    admitted = sum(r["placed"] for r in bursts)
    depth_after = depth()
    waiting_placed = Job.objects.filter(run_id__in=waiting_ids, instance__isnull=False)
    runs_placed_twice = (Run.objects.filter(pk__in=waiting_ids).filter(jobs__instance__isnull=False)
                         .values("pk").annotate(n=Count("jobs"))
                         .filter(n__gt=1).count())
    from_events = [d for p, _ in projects for d in double_placements(p)]
    delays = [d for r in bursts for d in r["release_to_placed"]]
    rates = [r["admissions_per_s"] for r in bursts]
    # what was placed is the head of the queue: no waiting run of a higher priority in its project left behind
    out_of_order = 0
    for pid in project_ids:
        lowest = (waiting_placed.filter(run__project_id=pid).order_by("run__priority")
                  .values_list("run__priority", flat=True).first())
        if lowest is not None:
            out_of_order += waiting_jobs(pid).filter(run__priority__gt=lowest).count()
    checks = {
        "freed hosts not placed again": sum(r["hosts_freed"] - r["placed"] for r in bursts if r["placed"] <= r["hosts_freed"]),
        "hosts given two jobs in a burst": sum(r["hosts_given_twice_in_burst"] for r in bursts)
        + sum(max(0, r["placed"] - r["hosts_freed"]) for r in bursts),
        "runs placed twice": runs_placed_twice,
        "hosts held by two active jobs (sampled)": len(doubles),
        "hand-overs before the previous job ended (events)": len(from_events),
        "queue not shorter by the jobs placed": abs((queue_depth - depth_after) - waiting_placed.count()),
        "waiting runs placed != admissions": abs(waiting_placed.count() - admitted),
    }
    tasks = measured["tasks"]
    per_admission = {k: round(v["queries"] / max(admitted, 1), 2) for k, v in tasks.items()}
    summary = {
        "hosts": args.hosts, "projects": args.projects, "shared": args.shared, "depth": queue_depth,
        "depth_after": depth_after, "workers": args.workers, "concurrency": args.concurrency,
        "admitted": admitted, "admissions_per_s_median": pct(rates, 0.5), "admissions_per_s_min": min(rates),
        "admissions_per_s_overall": admitted / sum(r["drain_s"] for r in bursts),
        "placed_within_woken_s": sum(r["woken"] for r in bursts), "woken_s": WOKEN_S,
        "woken_per_s_median": pct([r["woken_per_s"] for r in bursts], 0.5),
        "p50": pct(delays, 0.5), "p95": pct(delays, 0.95), "p99": pct(delays, 0.99), "max": max(delays, default=None),
        "statements_per_admission": sum(v["queries"] for v in tasks.values()) / max(admitted, 1),
        "statements_per_admission_by_task": per_admission,
        "task_calls_per_admission": {k: round(v["calls"] / max(admitted, 1), 2) for k, v in tasks.items()},
        "task_ms_per_call": {k: round(v["ms"] / max(v["calls"], 1), 1) for k, v in tasks.items()},
        "worker_cpu_s_per_admission": measured["cpu_s"] / max(admitted, 1),
        "load_average": [r["load"] for r in bursts], "priority_order_violations": out_of_order,
        "checks": checks, "samples": doubles[:10] + from_events[:10],
    }
    table(f"queueing: {args.hosts} hosts ({'shared' if args.shared else f'{args.projects} fleets'}), "
          f"depth {queue_depth}, bursts of {args.burst}, {args.workers} worker(s) x {args.concurrency}",
          ["burst", "placed", "admissions/s", f"placed <= {WOKEN_S:.0f} s", "their rate/s", "p50 s", "p95 s",
           "p99 s", "max s", "load 1m (start-end)", "broker backlog (start-end)"],
          [[i + 1, r["placed"], r["admissions_per_s"], r["woken"], r["woken_per_s"], r["p50"], r["p95"], r["p99"],
            r["max"],
            f"{r['load'][0]}-{r['load'][3]}", "-".join(map(str, r["broker_backlog"]))] for i, r in enumerate(bursts)])
    print(f"\nplaced within {WOKEN_S:.0f} s of their host's release: {summary['placed_within_woken_s']} of {admitted} "
          f"(median rate of those {summary['woken_per_s_median']:.1f}/s)")
    print(f"admissions/s: median {summary['admissions_per_s_median']:.1f}, overall "
          f"{summary['admissions_per_s_overall']:.1f} (aim >= {AIM_RATE:.0f}); release-to-placed p50 "
          f"{summary['p50']:.3f} p95 {summary['p95']:.3f} p99 {summary['p99']:.3f} s (aim p99 <= {AIM_P99}); "
          f"depth {queue_depth} -> {depth_after}; statements per admission {summary['statements_per_admission']:.1f}; "
          f"worker CPU-s per admission {summary['worker_cpu_s_per_admission']:.4f}", flush=True)
    print("statements per admission by task: " + json.dumps(per_admission))
    print("ms per task call: " + json.dumps(summary["task_ms_per_call"]))
    print("checks (all 0): " + json.dumps(checks))
    print(f"run priority order: {out_of_order} waiting runs of a higher priority than one placed in their project")
    for b in bursts:
        b.pop("new_jobs"), b.pop("chosen"), b.pop("release_to_placed")
    save("queueing", {"scenario": "queueing", "machine": info, "args": vars(args), "store": session.describe(),
                      "summary": summary, "bursts": bursts})
    return 1 if any(checks.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
