"""groups: the three-group PD shape on a hollow fleet with GPU hosts, startup_order workers-first.

Each run: a CPU router group (nodes: 4, no GPU; the master, job 0) + prefill (nodes: 4, gpu: L40S:8)
+ decode (nodes: 4, gpu: L40S:8) = 12 jobs. The fleet of H hollow hosts has GPU_FRACTION of them
with 8 x L40S. Runs are submitted one after another (each after the previous has ended), so every
run sees an idle fleet. Measures, per run, seconds from submit to the master `running` (its
`start_time` set; workers-first, so only after the 8 workers are up) and to every job placed; the
table gives the medians, jobs placed per second, and statements per job over all runs of a size
(counted in the workers, like place).
"""

from __future__ import annotations

import statistics
import time

from bench import harness
from bench.hollow import make_hollow_fleet
from bench.scenarios.common import Meter, per_job, project_with_user, table

GPU_FRACTION = 0.5
RUNS = 5
PD_YAML = """type: task
startup_order: workers-first
retry: false
groups:
  - name: router
    nodes: 4
    commands: [echo]
  - name: prefill
    nodes: 4
    commands: [echo]
    resources: {gpu: "L40S:8"}
  - name: decode
    nodes: 4
    commands: [echo]
    resources: {gpu: "L40S:8"}
"""
JOBS = 12


def one_size(session: harness.Session, H: int, workers: list, runs: int, timeout: float) -> dict:
    from django.db.models import Count

    from runs.models import Job, Run
    from runs.services.submission import submit_run

    project, user, _ = project_with_user(f"groups-{H}-{int(time.time())}")
    make_hollow_fleet(project, f"hollow-gpu-{H}", H, gpu_fraction=GPU_FRACTION)
    meter = Meter(session, [w.pid for w in workers])
    meter.start()
    per_run = []
    for _ in range(runs):
        t0 = time.perf_counter()
        run = submit_run(project, user, {"configuration": PD_YAML})
        marks: dict[str, float] = {}

        def progress(run_id=run.id, t0=t0, marks=marks):
            now = time.perf_counter() - t0
            jobs = list(Job.objects.filter(run_id=run_id).values_list("job_num", "instance_id", "start_time"))
            if len(jobs) >= JOBS and all(j[1] is not None for j in jobs):
                marks.setdefault("placed", now)
            if any(j[0] == 0 and j[2] is not None for j in jobs):
                marks.setdefault("master_running", now)
            if Run.objects.filter(id=run_id, status__in=["done", "failed", "terminated"]).exists():
                marks.setdefault("finished", now)
            return "finished" in marks

        harness.wait_until(progress, timeout, every=0.05)
        run.refresh_from_db()
        per_run.append({"run": run.name, "status": run.status, **marks})
    measure = Meter.stop(meter, pg_settle=11.0)
    complete = [r for r in per_run if "master_running" in r and r["status"] == "done"]
    placed = [r["placed"] for r in per_run if "placed" in r]
    statuses = dict(Run.objects.filter(project=project).values_list("status").annotate(n=Count("id")))
    # placement check: the router group on CPU hosts, the workers on 8-GPU hosts
    misplaced = Job.objects.filter(run__project=project, node_group_name="router", instance__gpu_count__gt=0).count() \
        + Job.objects.filter(run__project=project, node_group_name__in=["prefill", "decode"],
                             instance__gpu_count__lt=8).count()
    return {
        "H": H, "gpu_hosts": int(round(H * GPU_FRACTION)), "runs": runs, "jobs": runs * JOBS, "per_run": per_run,
        "run_statuses": statuses, "misplaced_jobs": misplaced, "complete": len(complete) == runs,
        "master_running_median_s": statistics.median([r["master_running"] for r in complete]) if complete else None,
        "master_running_max_s": max([r["master_running"] for r in complete], default=None),
        "placed_median_s": statistics.median(placed) if placed else None,
        "jobs_placed_per_s": JOBS / statistics.median(placed) if placed else None,
        "finished_median_s": statistics.median([r["finished"] for r in complete]) if complete else None,
        **per_job(measure, runs * JOBS), "raw": measure,
    }


def run(session: harness.Session, args) -> dict:
    sizes = args.sizes or [100, 1000]
    runs = args.runs or RUNS
    workers = [p for n, p in session.procs.items() if n.startswith("worker")] or \
        [session.start_worker(f"worker{i}", args.concurrency) for i in range(args.workers)]
    if "beat" not in session.procs:
        session.start_beat()
    time.sleep(1)
    results = []
    for H in sizes:
        r = one_size(session, H, workers, runs, args.timeout)
        results.append(r)
        print(f"  H={H}: {runs} runs x {JOBS} jobs, statuses {r['run_statuses']}, jobs on the wrong kind of host "
              f"{r['misplaced_jobs']}, master running in "
              f"{[round(x.get('master_running', -1), 2) for x in r['per_run']]}", flush=True)
    rows = [[r["H"], r["gpu_hosts"], r["runs"], r["master_running_median_s"] or "-", r["master_running_max_s"] or "-",
             r["placed_median_s"] or "-", r["jobs_placed_per_s"] or "-", r["finished_median_s"] or "-",
             r["statements_per_job"], r["statements_per_job_excl_sweep"], r["xacts_per_job"], r["cpu_s_per_job"]]
            for r in results]
    text = table("groups: router 4 CPU + prefill 4 x L40S:8 + decode 4 x L40S:8, workers-first, one run at a time",
                 ["H", "GPU hosts", "runs", "s to master running (median)", "max", "s to 12 placed (median)",
                  "jobs placed/s", "s to done (median)", "stmts/job", "stmts/job excl sweep", "xacts/job",
                  "worker CPU-s/job"], rows)
    tasks = sorted({k for r in results for k in r["by_task_per_job"]})
    text += table("groups: statements per job by task", ["H", *[t.split(".")[-1] for t in tasks]],
                  [[r["H"], *[r["by_task_per_job"].get(t, 0.0) for t in tasks]] for r in results])
    return {"sizes": results, "table": text}
