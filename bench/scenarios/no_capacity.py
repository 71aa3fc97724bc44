"""no-capacity: runs of a 4-node task that no fleet can hold, without retry.

The project has a hollow fleet of 8 CPU-only hosts; the task asks for 8 A100s per node. Measures
seconds from the first submit until every run is `failed` with job 0 ended by
failed_to_start_due_to_no_capacity, runs/s, statements and transactions per run and per job
(counted in the workers), worker CPU seconds per job.
"""

from __future__ import annotations

import time

from bench import harness
from bench.hollow import make_hollow_fleet
from bench.scenarios.common import Meter, per_job, project_with_user, submit_burst, table, task_yaml

NODES = 4


def run(session: harness.Session, args) -> dict:
    from django.db.models import Count

    from runs.models import Job, Run

    count = args.runs or 200
    workers = [p for n, p in session.procs.items() if n.startswith("worker")] or \
        [session.start_worker(f"worker{i}", args.concurrency) for i in range(args.workers)]
    if "beat" not in session.procs:
        session.start_beat()
    project, user, _ = project_with_user(f"nocap-{int(time.time())}")
    make_hollow_fleet(project, "cpu-only", 8)
    meter = Meter(session, [w.pid for w in workers])
    meter.start()
    t0 = time.perf_counter()
    submit_s, submit_q = submit_burst(project, user, task_yaml(NODES, gpu="A100:8"), count)

    def all_ended():
        return Run.objects.filter(project=project, status__in=["done", "failed", "terminated"]).count() >= count

    ended = harness.wait_until(all_ended, args.timeout, every=0.1)
    elapsed = time.perf_counter() - t0
    measure = meter.stop()
    statuses = dict(Run.objects.filter(project=project).values_list("status").annotate(n=Count("id")))
    right = Job.objects.filter(run__project=project, job_num=0, run__status="failed",
                               termination_reason="failed_to_start_due_to_no_capacity").count()
    jobs = count * NODES
    pj = per_job(measure, jobs)
    result = {
        "runs": count, "jobs": jobs, "complete": bool(ended), "seconds": elapsed, "runs_per_s": count / elapsed,
        "submit_s": submit_s, "submit_statements_per_run": submit_q / count, "run_statuses": statuses,
        "failed_with_no_capacity": right, **pj,
        "statements_per_run": pj["statements_per_job"] * NODES, "raw": measure,
    }
    text = table(f"no-capacity: {count} runs x {NODES} nodes, no fleet fits, no retry",
                 ["runs", "all failed in s", "runs/s", "failed w/ no-capacity", "stmts/run", "stmts/job",
                  "stmts/job excl sweep", "xacts/job", "worker CPU-s/job", "submit stmts/run"],
                 [[count, elapsed if ended else f">{elapsed:.0f}", count / elapsed, right,
                   result["statements_per_run"], pj["statements_per_job"], pj["statements_per_job_excl_sweep"],
                   pj["xacts_per_job"], pj["cpu_s_per_job"], result["submit_statements_per_run"]]])
    text += table("no-capacity: statements per job by task", list(pj["by_task_per_job"]),
                  [list(pj["by_task_per_job"].values())])
    result["table"] = text
    return result
