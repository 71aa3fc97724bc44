"""`make chaos` / `python -m bench.chaos`: placement under fault injection, then invariant checks.

The `place` workload at moderate size (200 runs of 1 and 2 nodes on a hollow fleet with room for all)
runs while a supervisor SIGKILLs a random Celery worker process every few seconds (a prefork child,
or a worker's main process together with its children, which is then restarted), and the broker
Redis is restarted mid-way. Beside them, `--restart-runs` runs of two groups whose second group
fails once and restarts (`on_failure: restart-group`, on the same hollow host) go through the same
faults. That Redis is the bench's own redis-server on a spare port (6391 when
free) with persistence off (--save ""), so a restart loses every queued message; the machine's
shared Redis is never touched. PostgreSQL database muster_chaos (`--db`) is created and dropped.

Beside them, TPU runs (bench/chaos_tpu.py: single slices and multislice sets, created directly and
as queued spot resources, on the real gcp backend against the fake TPU API with hollow hosts) have
their slices preempted while they run, and retry.

Then the serving scenario (bench/chaos_pd.py, `--serving yes|no|only`): a PD service with the real
smg router under request load through the endpoint, with worker kills, a router kill and a Redis
restart during a rolling update; its own checks, and the exit status is 1 when either fails.

After settling, the checks below must all be 0; the exit status is 1 otherwise:
  runs not in a terminal or `running` state, jobs stuck beyond three sweep intervals, instances
  assigned to two live jobs, busy instances with no live job, processes left after the stop,
  slices billed with no run, queued resources left, restart runs that did not end `done` after
  exactly one restart of their group, and (as 1) no run interrupted by a preemption.
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
from bench.chaos_tpu import TpuChaos
from bench.pd_service import supervise

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
    p.add_argument("--tpu-runs", type=int, default=16, help="TPU runs whose slices are preempted")
    p.add_argument("--preempt-every", type=float, default=1.0, help="seconds between preemptions")
    p.add_argument("--db", default="muster_chaos", help="the PostgreSQL database made and dropped for the run")
    p.add_argument("--restart-runs", type=int, default=20, help="runs whose second group fails once and restarts")
    p.add_argument("--serving", choices=("yes", "no", "only"), default="yes",
                   help="then the serving scenario (bench/chaos_pd.py, a process of its own); only: just that")
    args = p.parse_args(argv)
    if args.serving == "only":
        return subprocess.run([sys.executable, "-m", "bench.chaos_pd"], cwd=harness.ROOT).returncode
    code = placement(args)
    if args.serving == "yes":  # its own process: a Django setup and a bench session of its own
        print("\n== the serving scenario: python -m bench.chaos_pd", flush=True)
        code = max(code, subprocess.run([sys.executable, "-m", "bench.chaos_pd"], cwd=harness.ROOT).returncode)
    return code


def placement(args) -> int:
    rng = random.Random(int(os.environ.get("CHAOS_SEED", "0")) or None)

    port = free_or(args.redis_port)
    tpu = TpuChaos(args.tpu_runs, rng)
    session = harness.Session(db_name=args.db, redis_url=f"redis://127.0.0.1:{port}", redis_db=0, extra_env={
        "MUSTER_LEASE_SECONDS": "10", "MUSTER_SWEEP_INTERVAL": str(SWEEP), "BENCH_HOLLOW_RUN_SECONDS": "1",
        **tpu.start()})
    redis = PrivateRedis(port, session.id)
    print(f"chaos: session {session.id}; PostgreSQL {harness.PG}/{args.db}, private redis-server on :{port} "
          f"(--save \"\"); lease 10 s, sweep every {SWEEP:.0f} s; {args.workers} workers x {args.concurrency}",
          flush=True)
    checks: dict[str, int] = {}
    settled_event = threading.Event()  # set at teardown: no worker restarts after it
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
        tpu.submit(project, user)
        print(f"submitted {args.runs} runs, {args.restart_runs} restart runs and {args.tpu_runs} TPU runs in "
              f"{time.time() - t0:.1f}s", flush=True)

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
                    if not pids:  # (a worker just restarted may not be in /proc's tree yet)
                        continue
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

        settling = threading.Event()  # preemptions go on until the runs settle (a loaded machine
        # may bring the TPU runs to `running` only after the worker kills are over)

        def preemptions():
            while not settling.wait(max(0.2, args.preempt_every + rng.uniform(-0.5, 0.5))):
                victim = tpu.preempt_one()
                if victim:
                    events.append(f"{time.time() - t0:5.1f}s preempted {victim.rsplit('/', 1)[1]} while a run used it")

        # a worker that exits on its own (kombu's "Unrecoverable error" on the Redis restart) is
        # started again, as `muster serve` does; the kills above restart what they kill
        restarts: list[str] = []
        supervise(session, names, restarts, settled_event, lambda n: session.start_worker(n, args.concurrency), lock)
        thread = threading.Thread(target=chaos, daemon=True)
        thread.start()
        preempter = threading.Thread(target=preemptions, daemon=True)
        preempter.start()
        time.sleep(args.chaos_seconds)
        stop.set()
        thread.join()
        for line in events:
            print("  " + line)
        before = len(tpu.preempted)
        print(f"chaos over after {time.time() - t0:.0f}s ({len(events)} faults); settling", flush=True)

        def settled():
            return Run.objects.filter(project=project).exclude(status__in=["done", "failed", "terminated"]).count() == 0

        ok = harness.wait_until(settled, args.settle_timeout, every=1.0)
        settling.set()
        preempter.join()
        for line in events[len(events) - (len(tpu.preempted) - before):]:
            print("  " + line)
        print(f"{'settled' if ok else 'NOT settled'} at {time.time() - t0:.0f}s", flush=True)
        for line in restarts:
            print(f"  {line}")
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
        orphans = Instance.objects.filter(status="busy").exclude(id__in=busy_with_job)
        checks["busy instances with no live job"] = orphans.count()
        for name, backend, group in orphans.values_list("name", "backend", "group__status")[:10]:
            print(f"  busy with no live job: {name} ({backend}, group {group})")
        restarted = Run.objects.filter(project=project, name__startswith="restart-")
        once = restarted.filter(status="done").annotate(
            rows=Count("jobs", filter=Q(jobs__node_group_name="worker"))).filter(rows=2)
        checks["restart runs not done after one restart"] = restarted.count() - once.count()
        statuses = dict(Run.objects.filter(project=project).values_list("status").annotate(n=Count("id")))
        reasons = dict(Job.objects.filter(run__project=project).exclude(termination_reason="done_by_runner")
                       .values_list("termination_reason").annotate(n=Count("id")))
        print(f"runs by status: {statuses}; job reasons other than done_by_runner: {reasons}")
        # idle slices are deleted by the idle sweep (the TPU fleets keep none): give it a few sweeps
        harness.wait_until(lambda: not any(tpu.checks()[k] for k in ("slices billed with no run",
                                                                       "queued resources left")), 30, every=1.0)
        checks.update(tpu.checks())
        print(f"TPU: {tpu.summary()}")
    finally:
        settled_event.set()
        leftovers = session.teardown()
        redis.stop()
        tpu.stop()
        time.sleep(0.5)
        leftovers += [pid for pid in harness.marked_processes(session.id) if pid not in leftovers]
        checks["leftover processes"] = len(leftovers)
    width = max(len(k) for k in checks)
    print("\n== chaos checks (all must be 0)")
    for key, value in checks.items():
        print(f"{key.ljust(width)}  {value}")
    code = 0 if len(checks) == 10 and not any(checks.values()) else 1
    print("PASS" if code == 0 else "FAIL", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
