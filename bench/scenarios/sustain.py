"""sustain: placement under a sustained load, by fleet size and by worker processes.

For each H of --sizes (1,000 and 10,000 by default) and each count of --worker-counts (1, 2, 4;
fresh workers of 2 prefork children each): a hollow fleet of H, then for --sustain seconds (300,
the issue's 5 minutes; shorter with the flag) a burst of 4-node runs every second that tops the
queue up to QUEUED jobs waiting for a host (a closed loop: the queue never runs dry, and never
grows past what the engine could drain after the window). Hollow jobs run 2 s, so the fleet's
busy share stays well under H at these rates and no run waits for a host.

Figures per row: jobs placed per second over the window (jobs given a host between its start and
its end), statements and transactions per placed job, worker CPU-s per placed job, and what each
server was busy with over the window: the workers' CPU (all processes, as a share of the
machine's CPUs), PostgreSQL's (every `postgres` process: shared with anything else using the
server), Redis's (the `redis-server` process), and the machine's load average. Where the rate
stops growing with more workers, the resource near its limit says why.

Double placement is checked, not assumed: every 0.25 s a sampler looks for an instance held by
two active jobs, and at the end every instance's hand-overs are checked from the events (a job's
`provisioning` on a host must come after the previous job on it ended there).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from bench import harness
from bench.hollow import make_hollow_fleet
from bench.scenarios.common import Meter, per_job, project_with_user, submit_burst, table, task_yaml
from bench.scenarios.workers import CONCURRENCY, _stop_workers

NODES = 4
QUEUED = 200  # jobs waiting for a host that each burst tops up to


def _named_cpu(name: str) -> float:
    """utime+stime of every process called `name` (a server's processes, whoever they serve)."""
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if stat[stat.index("(") + 1:stat.rindex(")")] == name:
            fields = stat.rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def double_placements(project) -> list[str]:
    """Instances whose events show a job taking them before the previous job on them ended."""
    from events.models import Event
    from runs.choices import JOB_FINISHED

    spans: dict[int, list[tuple]] = {}
    rows = (Event.objects.filter(project=project, job__isnull=False, subject__startswith="job ")
            .values_list("job__instance_id", "job_id", "status", "created"))
    by_job: dict[int, dict] = {}
    for instance_id, job_id, status, created in rows:
        entry = by_job.setdefault(job_id, {"instance": instance_id})
        if status == "provisioning":
            entry["start"] = created
        elif status in JOB_FINISHED:
            entry["end"] = created
    for job_id, entry in by_job.items():
        if entry.get("instance") and entry.get("start"):
            spans.setdefault(entry["instance"], []).append((entry["start"], entry.get("end"), job_id))
    found = []
    for instance_id, jobs in spans.items():
        jobs.sort(key=lambda s: s[0])
        for (_, end, a), (start, _, b) in zip(jobs, jobs[1:], strict=False):
            if end is None or start < end:
                found.append(f"instance {instance_id}: job {b} placed at {start} before job {a} ended ({end})")
    return found


def one_row(session: harness.Session, H: int, workers: list, seconds: float, timeout: float) -> dict:
    from django.db import connection
    from django.db.models import Count

    from runs.choices import JOB_ACTIVE
    from runs.models import Job, Run

    project, user, _ = project_with_user(f"sustain-{H}-{len(workers)}-{int(time.time())}")
    make_hollow_fleet(project, f"hollow-{H}", H)
    doubles: list = []
    stop = threading.Event()

    def sample() -> None:
        try:
            while not stop.wait(0.25):
                held = (Job.objects.filter(run__project=project, status__in=JOB_ACTIVE, instance__isnull=False)
                        .values("instance_id").annotate(n=Count("id")).filter(n__gt=1))
                doubles.extend(f"instance {r['instance_id']} held by {r['n']} active jobs" for r in held)
        finally:
            connection.close()

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    placed = Job.objects.filter(run__project=project, instance__isnull=False)
    waiting = Job.objects.filter(run__project=project, status="submitted", instance__isnull=True)
    meter = Meter(session, [w.pid for w in workers])
    meter.start()
    pg0, redis0, load0 = _named_cpu("postgres"), _named_cpu("redis-server"), os.getloadavg()[0]
    t0 = time.perf_counter()
    submitted = 0
    while time.perf_counter() - t0 < seconds:
        due = time.perf_counter() + 1.0
        burst = max(0, (QUEUED - waiting.count()) // NODES)
        if burst:
            submit_burst(project, user, task_yaml(NODES), burst)
            submitted += burst
        time.sleep(max(0.0, due - time.perf_counter()))
    window = time.perf_counter() - t0
    placed_in_window = placed.count()
    cpu_pg, cpu_redis = _named_cpu("postgres") - pg0, _named_cpu("redis-server") - redis0
    measure = Meter.stop(meter, pg_settle=0)
    load1 = os.getloadavg()[0]
    ended = harness.wait_until(lambda: not Run.objects.filter(project=project).exclude(
        status__in=["done", "failed", "terminated"]).exists(), timeout, every=0.5)
    stop.set()
    sampler.join(5)
    from_events = double_placements(project)
    statuses = dict(Run.objects.filter(project=project).values_list("status").annotate(n=Count("id")))
    cpus = os.cpu_count() or 1
    return {
        "H": H, "workers": len(workers), "concurrency": CONCURRENCY, "window_s": round(window, 1),
        "runs_submitted": submitted, "jobs_placed_in_window": placed_in_window,
        "jobs_placed_per_s": placed_in_window / window, "drained": bool(ended), "run_statuses": statuses,
        "worker_cpu_share": measure["cpu_s"] / (window * cpus), "pg_cpu_share": cpu_pg / (window * cpus),
        "redis_cpu_share": cpu_redis / (window * cpus), "load_average": [round(load0, 1), round(load1, 1)],
        "double_placements_sampled": doubles[:20], "double_placements_in_events": from_events[:20],
        "double_placements": len(doubles) + len(from_events),
        **per_job(measure, max(placed_in_window, 1)),
    }


def run(session: harness.Session, args) -> dict:
    sizes = args.sizes or [1000, 10000]
    counts = getattr(args, "worker_counts", None) or [1, 2, 4]
    seconds = getattr(args, "sustain", None) or 300.0
    if "beat" not in session.procs:
        session.start_beat()
    rows = []
    for H in sizes:
        for n in counts:
            _stop_workers(session)
            workers = [session.start_worker(f"worker{i}", CONCURRENCY) for i in range(n)]
            time.sleep(1)
            r = one_row(session, H, workers, seconds, args.timeout)
            rows.append(r)
            print(f"  H={H}, {n} worker(s) x {CONCURRENCY}: {r['jobs_placed_per_s']:.1f} jobs placed/s over "
                  f"{r['window_s']} s, worker CPU {r['worker_cpu_share']:.0%}, PostgreSQL {r['pg_cpu_share']:.0%}, "
                  f"Redis {r['redis_cpu_share']:.0%} of the CPUs; double placements {r['double_placements']}",
                  flush=True)
    _stop_workers(session)
    for i in range(args.workers):
        session.start_worker(f"worker{i}", args.concurrency)
    text = table(f"sustain: {seconds:.0f} s of bursts topping the queue up to {QUEUED} waiting jobs (4-node runs), "
                 f"by fleet size and worker processes x {CONCURRENCY} children; CPU shares of {os.cpu_count()} CPUs",
                 ["H", "workers", "jobs placed", "jobs placed/s", "stmts/job", "xacts/job", "worker CPU-s/job",
                  "worker CPU", "PostgreSQL CPU", "Redis CPU", "load avg", "drained", "double placements"],
                 [[r["H"], r["workers"], r["jobs_placed_in_window"], r["jobs_placed_per_s"], r["statements_per_job"],
                   r["xacts_per_job"], r["cpu_s_per_job"], f"{r['worker_cpu_share']:.0%}",
                   f"{r['pg_cpu_share']:.0%}", f"{r['redis_cpu_share']:.0%}",
                   f"{r['load_average'][0]}-{r['load_average'][1]}", "yes" if r["drained"] else "NO",
                   r["double_placements"]] for r in rows])
    return {"seconds": seconds, "queued": QUEUED, "rows": rows, "table": text}
