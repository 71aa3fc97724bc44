"""`python -m bench.watch`: the batch watch's cost per look at N running jobs, in this process.

N one-node runs are placed and started on N hollow hosts (bench/hollow.py: their jobs run for as
long as the bench lasts) by the engine's own steps, called here one message at a time as
`bench.trace` does; then every job is made due and `watch_running` is called --reps times. Prints
the statements of one call and this process's CPU milliseconds per job looked at (the database's
own CPU is not in it). `--fleet-config ssh` gives the fleet a configuration the size of an SSH
fleet's with N hosts (every host is listed in it), what a watch that read the fleet with every
job's row paid for on each look.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time

from bench import harness


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.watch")
    p.add_argument("--jobs", type=int, default=1000)
    p.add_argument("--reps", type=int, default=10, help="watch calls measured, each over every job")
    p.add_argument("--fleet-config", choices=("hollow", "ssh"), default="hollow")
    args = p.parse_args(argv)
    session = harness.Session(db_name=os.environ.get("BENCH_WATCH_DB", "muster_bench_watch"),
                              extra_env={"BENCH_HOLLOW_RUN_SECONDS": "1000000", "BENCH_POLL_INTERVAL": "1.0"})
    try:
        session.setup()
        return measure(args)
    finally:
        session.teardown()


def measure(args) -> int:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from bench import trace
    from bench.hollow import make_hollow_fleet
    from bench.scenarios.common import project_with_user, task_yaml
    from engine.running.watch import watch_running
    from instances.models import Fleet
    from runs.models import Job
    from runs.services.submission import submit_run

    queue: collections.deque = collections.deque()
    steps = trace._steps(queue)
    project, user, _ = project_with_user("watch")
    make_hollow_fleet(project, "hollow", args.jobs)
    if args.fleet_config == "ssh":  # instances/services/ssh_fleets.py stores every host in it
        fleet = Fleet.objects.get(project=project, name="hollow")
        fleet.configuration = {**(fleet.configuration or {}), "ssh_config": {"user": "ubuntu", "hosts": [
            {"hostname": f"10.1.{i >> 8}.{i & 255}", "port": 22, "user": "ubuntu", "identity_file": "~/.ssh/id_ed25519"}
            for i in range(args.jobs)]}}
        fleet.save(update_fields=["configuration"])
    for _ in range(args.jobs):
        submit_run(project, user, {"configuration": task_yaml(1)})
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        while queue:
            name, pk = queue.popleft()
            steps[name](pk)
        if Job.objects.filter(status="running").count() == args.jobs:
            break
        watch_running()
    running = Job.objects.filter(status="running").count()
    Job.objects.update(next_check_at=None)
    with CaptureQueriesContext(connection) as q:
        looked = watch_running()
    looks, cpu = 0, 0.0
    for _ in range(args.reps):
        Job.objects.update(next_check_at=None)
        started = time.process_time()
        looks += watch_running()
        cpu += time.process_time() - started
    print(f"{running} running jobs on hollow hosts, fleet configuration {args.fleet_config}: one watch call looked at "
          f"{looked} in {len(q)} statements; {args.reps} calls: {looks} looks, "
          f"{cpu * 1000 / max(looks, 1):.3f} CPU ms per look (this process)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
