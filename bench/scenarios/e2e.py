"""e2e: examples/pd-disagg-local.yml, end to end on the LOCAL backend (real runner agents and job
processes), 20 runs one after another.

A local fleet of 3 instances (127.0.0.x, instances.services.fleets.create_local_fleet) in a project of its
own. The example has a fixed run name and port 8000 on every node, so runs cannot overlap: each run
is submitted (through runs.services.submission.submit_run, with the YAML's `name:` line changed to
a distinct name) only after the previous one has ended. Measures seconds from submit to `done`
(median, p95, max) and counts the runs that did not end `done`. At the end the fleet's instances are
terminated (their runner agents asked to exit); the session's teardown kills anything left by pid.
"""

from __future__ import annotations

import re
import statistics
import time

from bench import harness
from bench.scenarios.common import project_with_user, table

RUNS = 20
FLEET = 3
EXAMPLE = harness.ROOT / "examples" / "pd-disagg-local.yml"


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, -(-95 * len(ordered) // 100) - 1))]  # nearest rank


STAGES = ["workers running", "master running", "master ended", "run done"]


def stage_times(run) -> dict[str, float]:
    """Seconds from submit to each stage, read from the run's events (where the time goes)."""
    from events.models import Event

    first: dict[tuple[int, str], float] = {}
    for job_num, status, created in Event.objects.filter(run=run, job__isnull=False).values_list(
            "job__job_num", "status", "created"):
        first.setdefault((job_num, status), (created - run.submitted_at).total_seconds())
    run_done = Event.objects.filter(run=run, job__isnull=True, status="done").values_list("created", flat=True).first()
    workers = [t for (num, status), t in first.items() if num != 0 and status == "running"]
    ended = [t for (num, status), t in first.items() if num == 0 and status in ("terminating", "done", "failed")]
    out = {"workers running": max(workers) if workers else None, "master running": first.get((0, "running")),
           "master ended": min(ended) if ended else None,
           "run done": (run_done - run.submitted_at).total_seconds() if run_done else None}
    return {k: v for k, v in out.items() if v is not None}


def run(session: harness.Session, args) -> dict:
    from django.db.models import Count

    from engine.groups import terminate_fleet_instances
    from instances.services.fleets import create_local_fleet
    from runs.models import Run
    from runs.services.submission import submit_run
    from runs.transitions import request_stop

    count = args.runs or RUNS
    per_run_timeout = min(args.timeout, 120.0)
    if not any(n.startswith("worker") for n in session.procs):
        for i in range(args.workers):
            session.start_worker(f"worker{i}", args.concurrency)
    if "beat" not in session.procs:
        session.start_beat()
    project, user, _ = project_with_user(f"e2e-{int(time.time())}", superuser=True)
    fleet = create_local_fleet(project, "local", FLEET, placement="cluster")
    text = EXAMPLE.read_text()
    if not re.search(r"^name: pd-local$", text, flags=re.M):
        raise RuntimeError(f"{EXAMPLE} has no `name: pd-local` line to rename")
    per_run = []
    try:
        for i in range(count):
            doc = re.sub(r"^name: pd-local$", f"name: pd-local-{i}", text, flags=re.M)
            t0 = time.perf_counter()
            run = submit_run(project, user, {"configuration": doc})

            def ended(run_id=run.id):
                return Run.objects.filter(id=run_id, status__in=["done", "failed", "terminated"]).first()

            final = harness.wait_until(ended, per_run_timeout, every=0.05)
            elapsed = time.perf_counter() - t0
            if final is None:  # not ended in time: end it so the next run gets port 8000 (bench cleanup)
                request_stop(run, abort=True, actor="bench")
                harness.wait_until(ended, 30, every=0.2)
            status = final.status if final else "timeout"
            reason = final.termination_reason if final else ""
            per_run.append({"run": run.name, "status": status, "reason": reason, "seconds": elapsed,
                            "stages": stage_times(run)})
            print(f"  run {i + 1}/{count} {run.name}: {status} in {elapsed:.2f}s", flush=True)
    finally:
        terminate_fleet_instances(fleet, actor="bench")
    done = [r["seconds"] for r in per_run if r["status"] == "done"]
    statuses = dict(Run.objects.filter(project=project).values_list("status").annotate(n=Count("id")))
    result = {
        "runs": count, "fleet": FLEET, "per_run": per_run, "run_statuses": statuses,
        "not_done": count - len(done),
        "median_s": statistics.median(done) if done else None, "p95_s": p95(done) if done else None,
        "max_s": max(done, default=None), "min_s": min(done, default=None),
    }
    result["stage_medians_s"] = {
        stage: statistics.median(ts) for stage in STAGES
        if (ts := [r["stages"][stage] for r in per_run if stage in r["stages"]])}
    result["table"] = table(
        f"e2e: {count} runs of examples/pd-disagg-local.yml on a local fleet of {FLEET}, one after another",
        ["runs", "done", "not done", "submit->done median s", "p95 s", "min s", "max s"],
        [[count, len(done), result["not_done"], result["median_s"] or "-", result["p95_s"] or "-",
          result["min_s"] or "-", result["max_s"] or "-"]])
    result["table"] += "\n" + table(
        "e2e: where the time goes, median seconds from submit (from the runs' events)",
        STAGES, [[result["stage_medians_s"].get(stage, "-") for stage in STAGES]])
    return result
