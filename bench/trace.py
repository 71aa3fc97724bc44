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
    p.add_argument("--gpu", help="the run asks `gpu: GPU` (A100:8 on the CPU-only hollow hosts: the no-capacity path)")
    p.add_argument("--runs", type=int, default=1,
                   help="runs submitted at once; more than one prints CPU per job by task, not statements")
    p.add_argument("--profile", metavar="FILE", help="with --runs: write the engine steps' cProfile stats here")
    args = p.parse_args(argv)
    session = harness.Session(db_name=os.environ.get("BENCH_TRACE_DB", "muster_bench_trace"),
                              extra_env={"BENCH_HOLLOW_RUN_SECONDS": "0.3"})
    try:
        session.setup()
        return cpu(args) if args.runs > 1 else trace(args)
    finally:
        session.teardown()


def trace(args) -> int:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from bench.hollow import make_hollow_fleet
    from bench.scenarios.common import project_with_user, task_yaml
    from engine.running.watch import watch_running
    from runs.models import Job
    from runs.services.submission import submit_run

    queue: collections.deque = collections.deque()
    steps = _steps(queue)  # caught: each becomes one call below, in the order sent, countdowns ignored
    project, user, _ = project_with_user("trace")
    make_hollow_fleet(project, "hollow", args.hosts)
    with CaptureQueriesContext(connection) as q:
        run = submit_run(project, user, {"configuration": task_yaml(args.nodes, gpu=args.gpu)})
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


def _steps(queue: collections.deque) -> dict:
    """The engine's steps by name, their messages caught into `queue` (countdowns ignored).

    Caught where a message leaves (`messages.registered`), so what decides whether one is sent at
    all (once per transaction, the look after commit of `process_run_if`) runs as in a worker."""
    from engine import admission, finishing, messages
    from engine.processing import process_run, process_runs
    from engine.starting.advance import advance_job, advance_jobs
    from engine.submitted.provision import provision_job

    steps = {"provision_job": provision_job, "advance_job": advance_job, "finish_job": finishing.finish_job,
             "process_run": process_run, "admit_fleet": admission.admit_fleet,
             "finish_jobs": finishing.finish_jobs, "process_runs": process_runs, "advance_jobs": advance_jobs}

    class Caught:
        def __init__(self, name: str) -> None:
            self.name = name

        def delay(self, pk, *rest) -> None:
            queue.append((self.name, pk))

        def apply_async(self, args, **_options) -> None:
            queue.append((self.name, args[0]))

    class Registered:
        def __getattr__(self, name: str):
            if name not in steps:
                raise AssertionError(f"bench.trace: the engine sent {name}, which this trace does not run")
            return Caught(name)

    messages.registered = Registered()
    return steps


def cpu(args) -> int:
    """`--runs N`: N runs submitted at once, every step called as in `trace` but with no statement
    capture (Django's debug cursor costs CPU of its own); prints this process's CPU time per job
    by task. The database's own CPU is not in it: that is what `bench.run`'s place scenario adds."""
    import cProfile
    import pstats

    from bench.hollow import make_hollow_fleet
    from bench.scenarios.common import project_with_user, task_yaml
    from engine.running.watch import watch_running
    from runs.models import Job, Run
    from runs.services.submission import submit_run

    queue: collections.deque = collections.deque()
    steps = _steps(queue)
    project, user, _ = project_with_user("trace")
    make_hollow_fleet(project, "hollow", max(args.hosts, args.runs * args.nodes))
    runs = [submit_run(project, user, {"configuration": task_yaml(args.nodes, gpu=args.gpu)}).pk for _ in range(args.runs)]
    spent: dict[str, float] = collections.Counter()
    calls: dict[str, int] = collections.Counter()
    profiler = cProfile.Profile(time.process_time) if args.profile else None  # CPU, not waits on the database
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if not queue:
            if not Run.objects.filter(pk__in=runs, finished_at__isnull=True).exists():
                break
            name, step = "watch_running", watch_running
            pk = None
        else:
            name, pk = queue.popleft()
            step = steps[name]
        started = time.process_time()
        if profiler:
            profiler.enable()
        looked = step(pk) if pk is not None else step()
        if profiler:
            profiler.disable()
        spent[name] += time.process_time() - started
        calls[name] += 1
        if pk is None and not looked:
            time.sleep(0.05)
    jobs = Job.objects.filter(run__in=runs).count()
    ended = collections.Counter(Run.objects.filter(pk__in=runs).values_list("status", flat=True))
    print(f"{len(runs)} runs: {dict(ended)}; {jobs} jobs on {max(args.hosts, args.runs * args.nodes)} hollow hosts; "
          "this process's CPU ms per job by task (calls per job)")
    for name in sorted(spent):
        print(f"  {name:16} {spent[name] * 1000 / jobs:7.2f} ms  ({calls[name] / jobs:.2f})")
    print(f"  {'engine total':16} {sum(spent.values()) * 1000 / jobs:7.2f} ms")
    if profiler:
        profiler.dump_stats(args.profile)
        pstats.Stats(args.profile).sort_stats("cumulative").print_stats(25)
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
