"""`make chaos` / `python -m bench.chaos`: placement under fault injection, then invariant checks.

The `place` workload at moderate size (200 runs of 1 and 2 nodes on a hollow fleet with room for all)
runs while a supervisor SIGKILLs a random Celery worker process every few seconds (a prefork child,
or a worker's main process together with its children, which is then restarted), and the broker
Redis is restarted mid-way. Beside them, `--restart-runs` runs of two groups whose second group
fails once and restarts (`on_failure: restart-group`, on the same hollow host) go through the same
faults. That Redis is the bench's own redis-server on a spare port (6391 when
free) with persistence off (--save ""), so a restart loses every queued message; the machine's
shared Redis is never touched. PostgreSQL database muster_chaos (`--db`) is created and dropped.

After settling, the checks below must all be 0; the exit status is 1 otherwise:
  runs not in a terminal or `running` state, jobs stuck beyond three sweep intervals, instances
  assigned to two live jobs, busy instances with no live job, processes left after the stop, and
  restart runs that did not end `done` after exactly one restart of their group.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time

from bench import harness

SWEEP = 1.0
RESTART_RUN = """type: task
name: restart-{i}
groups:
  - name: head
    commands: [echo]
  - name: worker
    on_failure: restart-group
    commands: ["hollow: fail-once"]
"""


def free_or(port: int) -> int:
    import socket

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return port
        except OSError:
            return harness.free_port()


class PrivateRedis:
    def __init__(self, port: int, session_id: str):
        self.port, self.session_id = port, session_id
        self.dir = tempfile.mkdtemp(prefix="chaos-redis-")
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", self.dir], stdout=subprocess.DEVNULL, env={**os.environ, "BENCH_SESSION": self.session_id},
            start_new_session=True)
        ok = harness.wait_until(lambda: subprocess.run(["redis-cli", "-p", str(self.port), "ping"],
                                                       capture_output=True, text=True).stdout.strip() == "PONG", 15)
        if not ok:
            raise RuntimeError(f"redis-server on port {self.port} did not start")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--hosts", type=int, default=400)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--kill-every", type=float, default=3.0, help="seconds between kills (randomised +-1 s)")
    p.add_argument("--chaos-seconds", type=float, default=40.0)
    p.add_argument("--settle-timeout", type=float, default=300.0)
    p.add_argument("--redis-port", type=int, default=6391)
    p.add_argument("--db", default="muster_chaos", help="the PostgreSQL database made and dropped for the run")
    p.add_argument("--restart-runs", type=int, default=20, help="runs whose second group fails once and restarts")
    args = p.parse_args(argv)
    rng = random.Random(int(os.environ.get("CHAOS_SEED", "0")) or None)

    port = free_or(args.redis_port)
    session = harness.Session(db_name=args.db, redis_url=f"redis://127.0.0.1:{port}", redis_db=0, extra_env={
        "MUSTER_LEASE_SECONDS": "10", "MUSTER_SWEEP_INTERVAL": str(SWEEP), "BENCH_HOLLOW_RUN_SECONDS": "1"})
    redis = PrivateRedis(port, session.id)
    print(f"chaos: session {session.id}; PostgreSQL {harness.PG}/{args.db}, private redis-server on :{port} "
          f"(--save \"\"); lease 10 s, sweep every {SWEEP:.0f} s; {args.workers} workers x {args.concurrency}",
          flush=True)
    checks: dict[str, int] = {}
    events: list[str] = []
    code = 1
    try:
        redis.start()
        session.setup()
        from django.db.models import Count, Q
        from django.utils import timezone

        from bench.hollow import make_hollow_fleet
        from bench.scenarios.common import project_with_user, task_yaml
        from instances.models import Instance
        from runs.choices import JOB_ACTIVE, JOB_FINISHED
        from runs.models import Job, Run
        from runs.services.submission import submit_run

        names = [f"worker{i}" for i in range(args.workers)]
        for name in names:
            session.start_worker(name, args.concurrency)
        session.start_beat()
        project, user, _ = project_with_user("chaos")
        make_hollow_fleet(project, "hollow", args.hosts)
        t0 = time.time()
        for i in range(args.runs):
            submit_run(project, user, {"configuration": task_yaml(1 + i % 2)})
        for i in range(args.restart_runs):
            submit_run(project, user, {"configuration": RESTART_RUN.format(i=i)})
        print(f"submitted {args.runs} runs in {time.time() - t0:.1f}s", flush=True)

        stop = threading.Event()
        lock = threading.Lock()

        def chaos():
            redis_done = False
            start = time.time()
            while not stop.wait(max(0.5, args.kill_every + rng.uniform(-1, 1))):
                with lock:
                    if not redis_done and time.time() - start > args.chaos_seconds / 2:
                        redis.stop()
                        time.sleep(2)
                        redis.start()
                        redis_done = True
                        events.append(f"{time.time() - t0:5.1f}s redis restarted (queued messages lost)")
                        continue
                    name = rng.choice(names)
                    proc = session.procs.get(name)
                    if proc is None:
                        continue
                    pids = harness.tree(proc.pid)
                    victim = rng.choice(pids)
                    if victim == proc.pid:
                        os.killpg(proc.pid, signal.SIGKILL)
                        proc.wait()
                        session.procs.pop(name)
                        proc._bench_log.close()  # type: ignore[attr-defined]
                        for pid in [q for q in pids if q != victim]:
                            try:
                                os.kill(pid, signal.SIGKILL)
                            except OSError:
                                pass
                        session.start_worker(name, args.concurrency)
                        events.append(f"{time.time() - t0:5.1f}s SIGKILL {name} main pid {victim} (+children); "
                                      "restarted")
                    else:
                        try:
                            os.kill(victim, signal.SIGKILL)
                            events.append(f"{time.time() - t0:5.1f}s SIGKILL {name} child pid {victim}")
                        except OSError:
                            pass

        thread = threading.Thread(target=chaos, daemon=True)
        thread.start()
        time.sleep(args.chaos_seconds)
        stop.set()
        thread.join()
        for line in events:
            print("  " + line)
        print(f"chaos over after {time.time() - t0:.0f}s ({len(events)} faults); settling", flush=True)

        def settled():
            return Run.objects.filter(project=project).exclude(status__in=["done", "failed", "terminated"]).count() == 0

        ok = harness.wait_until(settled, args.settle_timeout, every=1.0)
        print(f"{'settled' if ok else 'NOT settled'} at {time.time() - t0:.0f}s", flush=True)
        time.sleep(3 * SWEEP + 1)
        now = timezone.now()
        old = now - timezone.timedelta(seconds=3 * SWEEP)
        live = [*JOB_ACTIVE, "terminating"]
        checks["runs not terminal or running"] = Run.objects.exclude(
            status__in=["done", "failed", "terminated", "running"]).count()
        checks["jobs stuck > 3 sweep intervals"] = Job.objects.exclude(status__in=JOB_FINISHED).filter(
            Q(next_check_at__isnull=True) | Q(next_check_at__lt=old), status_changed_at__lt=old).count()
        checks["instances with two live jobs"] = Job.objects.filter(status__in=live, instance__isnull=False).values(
            "instance").annotate(n=Count("id")).filter(n__gt=1).count()
        busy_with_job = Job.objects.filter(status__in=live, instance__isnull=False).values("instance")
        checks["busy instances with no live job"] = Instance.objects.filter(status="busy").exclude(
            id__in=busy_with_job).count()
        restarted = Run.objects.filter(project=project, name__startswith="restart-")
        once = restarted.filter(status="done").annotate(
            rows=Count("jobs", filter=Q(jobs__node_group_name="worker"))).filter(rows=2)
        checks["restart runs not done after one restart"] = restarted.count() - once.count()
        statuses = dict(Run.objects.filter(project=project).values_list("status").annotate(n=Count("id")))
        reasons = dict(Job.objects.filter(run__project=project).exclude(termination_reason="done_by_runner")
                       .values_list("termination_reason").annotate(n=Count("id")))
        print(f"runs by status: {statuses}; job reasons other than done_by_runner: {reasons}")
    finally:
        leftovers = session.teardown()
        redis.stop()
        time.sleep(0.5)
        leftovers += [pid for pid in harness.marked_processes(session.id) if pid not in leftovers]
        checks["leftover processes"] = len(leftovers)
    width = max(len(k) for k in checks)
    print("\n== chaos checks (all must be 0)")
    for key, value in checks.items():
        print(f"{key.ljust(width)}  {value}")
    code = 0 if len(checks) == 6 and not any(checks.values()) else 1
    print("PASS" if code == 0 else "FAIL", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
