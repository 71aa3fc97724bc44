"""place: a hollow fleet of H instances and a burst of 4-node runs filling a quarter of it.

Measures jobs placed per second (first submit -> every job has its instance), seconds from first
submit to every job `running`, statements and transactions per job (counted in the workers, the
whole life of each job: placement, start, watch, finish, run status, plus the sweeps of the window),
and worker CPU seconds per job (/proc of the worker processes and their children).
"""

from __future__ import annotations

import time

from bench import harness
from bench.hollow import make_hollow_fleet
from bench.scenarios.common import Meter, per_job, project_with_user, submit_burst, table, task_yaml

NODES = 4


def one_size(session: harness.Session, H: int, workers: list, timeout: float) -> dict:
    from django.db.models import Count, Q

    from runs.models import Job, Run

    project, user, _ = project_with_user(f"place-{H}-{int(time.time())}")
    t = time.perf_counter()
    make_hollow_fleet(project, f"hollow-{H}", H)
    fleet_s = time.perf_counter() - t
    runs = max(1, H // (4 * NODES))
    jobs = runs * NODES
    meter = Meter(session, [w.pid for w in workers])
    meter.start()
    t0 = time.perf_counter()
    submit_s, _ = submit_burst(project, user, task_yaml(NODES), runs)
    marks: dict[str, float] = {}
    seen = {"placed": 0, "running": 0, "at": 0.0}

    def progress():
        row = Job.objects.filter(run__project=project).aggregate(
            placed=Count("id", filter=Q(instance__isnull=False)),
            running=Count("id", filter=Q(start_time__isnull=False)))
        seen.update(placed=row["placed"], running=row["running"], at=time.perf_counter() - t0)
        finished = Run.objects.filter(project=project, status__in=["done", "failed", "terminated"]).count()
        now = time.perf_counter() - t0
        if row["placed"] >= jobs:
            marks.setdefault("placed", now)
        if row["running"] >= jobs:
            marks.setdefault("running", now)
        if finished >= runs:
            marks.setdefault("finished", now)
        return "finished" in marks

    harness.wait_until(progress, timeout, every=0.1)
    rss_after = [harness.tree_rss(w.pid) for w in workers]
    complete = "finished" in marks
    measure = Meter.stop(meter, pg_settle=11.0 if complete else 0)
    statuses = dict(Run.objects.filter(project=project).values_list("status").annotate(n=Count("id")))
    result = {
        "H": H, "runs": runs, "jobs": jobs, "fleet_create_s": fleet_s, "submit_s": submit_s,
        "placed_s": marks.get("placed"), "all_running_s": marks.get("running"), "finished_s": marks.get("finished"),
        "jobs_placed_per_s": jobs / marks["placed"] if "placed" in marks else seen["placed"] / seen["at"],
        "jobs_finished_per_s": jobs / marks["finished"] if complete else None,
        "placed_when_stopped": seen["placed"], "running_when_stopped": seen["running"],
        "run_statuses": statuses, "worker_rss_after": rss_after, "complete": complete,
        # per job that got as far as being placed (all of them when complete)
        **per_job(measure, jobs if complete else max(seen["placed"], 1)), "raw": measure,
    }
    return result


def abandon(session: harness.Session, workers: list, concurrency: int) -> list:
    """A size that did not finish in time: stop the workers, drop the queued messages, and end the
    project's rows directly (bench cleanup, not the product's stop path), then start fresh workers."""
    from django.db.models import Q
    from django.utils import timezone

    from instances.models import Instance
    from runs.models import Job, Run

    names = [n for n, p in session.procs.items() if p in workers]
    for name in names:
        session.stop(name, grace=60)
    session.redis().flushdb()
    Job.objects.filter(~Q(status__in=["done", "failed", "terminated", "aborted"])).update(
        status="terminated", termination_reason="terminated_by_server", lease_until=None, lease_token="")
    Run.objects.filter(~Q(status__in=["done", "failed", "terminated"])).update(
        status="terminated", termination_reason="server_error", finished_at=timezone.now(), lease_until=None)
    Instance.objects.filter(status="busy").update(status="idle", holder=None)
    return [session.start_worker(name, concurrency) for name in names]


def run(session: harness.Session, args) -> dict:
    sizes = args.sizes or ([10, 100, 1000] if args.quick else [10, 100, 1000, 10000])
    workers = [session.start_worker(f"worker{i}", args.concurrency) for i in range(args.workers)]
    beat = session.procs.get("beat") or session.start_beat()
    idle_rss = [harness.tree_rss(w.pid) for w in workers]
    time.sleep(1)
    results = []
    for H in sizes:
        r = one_size(session, H, workers, timeout=args.timeout)
        results.append(r)
        print(f"  H={H}: {progress_line(r, args.timeout)}", flush=True)
        if not r["complete"]:
            workers = abandon(session, workers, args.concurrency)
    rows = [[r["H"] if r["complete"] else f"{r['H']}*", r["runs"], r["jobs"], r["jobs_placed_per_s"] or "-",
             r["placed_s"] or "-",
             r["all_running_s"] or "-", r["statements_per_job"], r["statements_per_job_excl_sweep"],
             r["xacts_per_job"], r["cpu_s_per_job"], r["redis_commands_per_job"]] for r in results]
    text = table("place: hollow fleet of H, burst of 4-node runs filling H/4",
                 ["H", "runs", "jobs", "jobs placed/s", "s to placed", "s to running", "stmts/job",
                  "stmts/job excl sweep", "xacts/job", "worker CPU-s/job", "redis cmds/job"], rows)
    tasks = sorted({k for r in results for k in r["by_task_per_job"]})
    text += table("place: statements per job by task", ["H", *[t.split(".")[-1] for t in tasks]],
                  [[r["H"], *[r["by_task_per_job"].get(t, 0.0) for t in tasks]] for r in results])
    first, last = results[0], results[-1]
    ratio = last["statements_per_job_excl_sweep"] / first["statements_per_job_excl_sweep"]
    ratio_prov = (last["by_task_per_job"].get("engine.tasks.provision_job", 0)
                  / max(first["by_task_per_job"].get("engine.tasks.provision_job", 0), 1e-9))
    line = (f"statements per job (excl. sweep) H={last['H']} / H={first['H']}: {ratio:.3f}; "
            f"provision_job statements per job: {ratio_prov:.3f}")
    if not all(r["complete"] for r in results):
        line += (f"\n* did not finish within --timeout {args.timeout:.0f}s: rates and per-job figures are over the "
                 "jobs placed by then")
    print(line, flush=True)
    return {"sizes": results, "ratio_statements_per_job": ratio, "ratio_provision_statements": ratio_prov,
            "worker_rss_idle": idle_rss, "worker_rss_after_largest": last["worker_rss_after"],
            "beat_pid": beat.pid, "table": text + "\n" + line}


def progress_line(r: dict, timeout: float) -> str:
    """One measured size as a line of progress output (also used by the workers scenario)."""
    line = f"{r['jobs']} jobs, placed in {r['placed_s']}, running in {r['all_running_s']}, statuses {r['run_statuses']}"
    if not r["complete"]:
        line += (f"; NOT COMPLETE after {timeout:.0f}s: {r['placed_when_stopped']} placed, "
                 f"{r['running_when_stopped']} running; rest abandoned")
    return line
