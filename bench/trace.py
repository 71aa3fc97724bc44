"""`python -m bench.trace`: every statement each engine step runs for one run, from submit to done.

The steps run in this process, one message at a time (the engine's messages are caught instead of
sent), on hollow instances of the bench's PostgreSQL database; beat's watch tick is called when
nothing else is due. Prints each task call with its statements, and the statements per job by task,
the stable figure of the placement path on a loaded machine (bench/README.md, trace).
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time

from bench import harness


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.trace")
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--hosts", type=int, default=100)
    p.add_argument("--quiet", action="store_true", help="totals only, not every statement")
    args = p.parse_args(argv)
    session = harness.Session(db_name=os.environ.get("BENCH_TRACE_DB", "muster_bench_trace"),
                              extra_env={"BENCH_HOLLOW_RUN_SECONDS": "0.3"})
    try:
        session.setup()
        return trace(args)
    finally:
        session.teardown()


def trace(args) -> int:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from bench.hollow import make_hollow_fleet
    from bench.scenarios.common import project_with_user, task_yaml
    from engine import finishing, messages
    from engine.processing import process_run
    from engine.running.watch import watch_running
    from engine.starting.advance import advance_job
    from engine.submitted.provision import provision_job
    from runs.models import Job
    from runs.services.submission import submit_run

    queue: collections.deque = collections.deque()
    steps = {"provision_job": provision_job, "advance_job": advance_job, "finish_job": finishing.finish_job,
             "process_run": process_run}
    for name in steps:  # caught: each becomes one call below, in the order sent, countdowns ignored
        setattr(messages, name, (lambda n: lambda pk, *a, **k: connection.on_commit(
            lambda: queue.append((n, pk))))(name))
    project, user, _ = project_with_user("trace")
    make_hollow_fleet(project, "hollow", args.hosts)
    with CaptureQueriesContext(connection) as q:
        run = submit_run(project, user, {"configuration": task_yaml(args.nodes)})
    per_task: dict[str, int] = collections.Counter({"submit_run": len(q)})
    bare: dict[str, int] = collections.Counter({"submit_run": statements(q)})
    show("submit_run", run.pk, q, args.quiet)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        run.refresh_from_db()
        if run.finished and not queue:
            break
        if not queue:
            with CaptureQueriesContext(connection) as q:
                looked = watch_running()
            if looked:
                per_task["watch_running"] += len(q)
                bare["watch_running"] += statements(q)
                show("watch_running", looked, q, args.quiet)
            time.sleep(0.1)
            continue
        name, pk = queue.popleft()
        with CaptureQueriesContext(connection) as q:
            steps[name](pk)
        label = steps[name].__name__
        per_task[label] += len(q)
        bare[label] += statements(q)
        show(label, pk, q, args.quiet)
    jobs = Job.objects.filter(run=run).count()
    print(f"\nrun {run.name}: {run.status}; {jobs} jobs on {args.hosts} hollow hosts; per job: statements "
          "(as bench.run counts them: BEGIN and COMMIT not included) and round trips (all)")
    for label in sorted(per_task):
        print(f"  {label:16} {bare[label] / jobs:6.2f} statements  {per_task[label] / jobs:6.2f} round trips")
    engine = [k for k in per_task if k != "submit_run"]
    print(f"  {'engine total':16} {sum(bare[k] for k in engine) / jobs:6.2f} statements  "
          f"{sum(per_task[k] for k in engine) / jobs:6.2f} round trips")
    return 0


def statements(queries) -> int:
    return sum(1 for q in queries if q["sql"] not in ("BEGIN", "COMMIT", "ROLLBACK"))


def show(label: str, pk, queries, quiet: bool) -> None:
    if quiet:
        return
    print(f"-- {label}({pk}): {len(queries)} statements")
    for query in queries:
        print(f"     {query['sql'][:230]}")


if __name__ == "__main__":
    sys.exit(main())
