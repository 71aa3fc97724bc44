"""`python -m bench.chaos_pd` (run by `make chaos` after the placement scenario): a PD service under
faults during a rolling update, then invariant checks.

A PD service (the real `smg` router, a stand-in prefill and `--decode` stand-in decodes on the local
backend, bench/pd_service.py) serves `--clients` clients that POST /generate through the endpoint
process back to back, each request bounded by `--bound` seconds. It is re-applied with a new
revision (an update), and while that update rolls, every `--fault-every` seconds one fault: a decode
worker SIGKILLed, the broker Redis restarted (its queued messages lost; the sweeps re-enqueue), the
router SIGKILLed, the prefill SIGKILLed, another decode, the router again (a random replica of the
group, of whichever revision runs). A sampler reads every ready router's worker list every 0.5 s.

Once the update is complete and the worker lists settled, the service serves on for a few seconds,
the load stops and the service is stopped. Every answer must be a 200 or a 5xx a client can retry
(both counted); the checks below must all be 0 (exit status 1 otherwise): requests that hung past
the bound, requests answered otherwise (a 4xx, no HTTP answer), workers by which a router's list
differs from the ready workers of its revision once quiet, router lists holding two revisions at
once, an update that did not complete, a service that no longer answers after the faults, replica
jobs not finished after the stop, replica processes alive after the stop, and processes of the
session left after teardown.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path

from bench import harness
from bench.chaos import PrivateRedis, free_or
from bench.pd_service import (
    Load,
    alive,
    free_port_block,
    heads,
    pd_yaml,
    pid_at,
    session_env,
    smg_workers,
    stale,
    start_endpoint,
    started,
    strays,
    supervise,
)

SWEEP = 1.0
FAULTS = ["decode", "redis", "router", "prefill", "decode", "router"]
CHECKS = ["update not complete (v2 not serving, old revision running or lists unsettled)", "stale workers in a router once quiet",
          "no answer in the last 5 s", "requests hung past the bound",
          "requests answered otherwise (4xx, no HTTP answer)", "router lists holding two revisions",
          "replica jobs not finished after stop", "replica processes alive after stop",
          "runner or replica processes left after stop", "leftover processes"]


class ListSampler(threading.Thread):
    """Every 0.5 s, each ready router's list: one holding workers of two revisions is counted."""

    def __init__(self, run_id: int, port: int):
        super().__init__(daemon=True)
        self.run_id, self.port, self.stop, self.samples, self.mixed = run_id, port, threading.Event(), 0, []

    def run(self) -> None:
        from django.db import connection

        from runs.models import Job

        try:
            while not self.stop.wait(0.5):
                running = Job.objects.filter(run_id=self.run_id, status="running").select_related("instance")
                revision = {f"http://{j.instance.internal_ip}:{self.port}": j.deployment_num
                            for j in running if j.instance is not None}
                for router in [j for j in heads(self.run_id) if j.node_group_name == "router"]:
                    got = smg_workers(router.instance.internal_ip, self.port, timeout=2)
                    if got is None:
                        continue
                    self.samples += 1
                    seen = {revision[u] for u, _ in got if u in revision}
                    if len(seen) > 1:
                        self.mixed.append(f"router {router.instance.internal_ip}: revisions {sorted(seen)}")
        finally:
            connection.close()


def spans(odd: list, t0: float) -> list[str]:
    """The answers other than 200 as spans of one status (a gap over 2 s starts another)."""
    out: list[list] = []  # [status, count, first, last, longest wait]
    for a in sorted(odd, key=lambda a: a.at):
        at = a.at - t0
        if out and out[-1][0] == a.status and at - out[-1][3] <= 2:
            out[-1][1:] = [out[-1][1] + 1, out[-1][2], at, max(out[-1][4], a.took)]
        else:
            out.append([a.status, 1, at, at, a.took])
    return [f"{status} x{n} sent {first:.1f}s-{last:.1f}s (slowest answer {took:.2f}s)"
            for status, n, first, last, took in out]


def kill_one(run_id: int, group: str, piddir, rng: random.Random) -> str | None:
    """SIGKILL the server of a random running replica of `group`; what was done, or why nothing was."""
    from runs.models import Job

    jobs = list(Job.objects.filter(run_id=run_id, node_group_name=group, status="running", superseded=False)
                .select_related("instance"))
    rng.shuffle(jobs)
    for job in jobs:
        pid = pid_at(piddir, job.instance.internal_ip) if job.instance else None
        if pid and alive(pid):
            os.kill(pid, signal.SIGKILL)
            return f"SIGKILL {group} pid {pid} at {job.instance.internal_ip} (deployment {job.deployment_num})"
    rows = Job.objects.filter(run_id=run_id, node_group_name=group).order_by("id").values_list(
        "job_num", "deployment_num", "status", "superseded")
    return f"no live {group} to kill; its jobs (num, deployment, status, superseded): {list(rows)[-4:]}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.chaos_pd", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--decode", type=int, default=2, help="decode replicas")
    p.add_argument("--hosts", type=int, default=12, help="local instances (room for both revisions and replacements)")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--bound", type=float, default=30.0, help="seconds a request may take before it counts as hung")
    p.add_argument("--fault-every", type=float, default=4.0)
    p.add_argument("--settle-timeout", type=float, default=240.0)
    p.add_argument("--redis-port", type=int, default=6392)
    p.add_argument("--db", default="muster_chaos_pd")
    args = p.parse_args(argv)
    rng = random.Random(int(os.environ.get("CHAOS_SEED", "0")) or None)
    port = free_or(args.redis_port)
    session = harness.Session(db_name=args.db, redis_url=f"redis://127.0.0.1:{port}", redis_db=0, count=False,
                              extra_env={"MUSTER_LEASE_SECONDS": "10", "MUSTER_SWEEP_INTERVAL": str(SWEEP),
                                         "MUSTER_DRAIN_DELAY": "1", "MUSTER_ROUTER_SYNC_INTERVAL": "2",
                                         **session_env()})
    redis = PrivateRedis(port, session.id)
    print(f"chaos (serving): session {session.id}; PostgreSQL {harness.PG}/{args.db}, private redis-server on "
          f":{port}; a PD service (smg + 1 prefill + {args.decode} decodes, local backend), {args.clients} clients "
          f"bounded at {args.bound:.0f}s; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs", flush=True)
    checks = dict.fromkeys(CHECKS, 1)  # 1 until measured: a scenario cut short fails every check it did not reach
    tally: dict[str, int] = {}
    events: list[str] = []
    restarts: list[str] = []
    supervised = threading.Event()
    piddir = session.data_dir / "pd"
    piddir.mkdir()
    load = sampler = None
    try:
        redis.start()
        session.setup()
        from bench.scenarios.common import project_with_user
        from engine.groups import terminate_fleet_instances
        from instances.services.fleets import create_local_fleet
        from runs.choices import JOB_FINISHED
        from runs.models import Job, Run
        from runs.services.submission import submit_run
        from runs.transitions import request_stop

        session.start_worker("worker0", 3)
        session.start_beat()
        supervise(session, ["worker0", "beat"], restarts, supervised,
                  lambda name: session.start_worker(name, 3) if name.startswith("worker") else session.start_beat())
        endpoint = start_endpoint(session)
        project, user, token = project_with_user("chaos-pd", superuser=True)
        fleet = create_local_fleet(project, "local", args.hosts, placement="cluster")
        sport = free_port_block()
        t0 = time.time()
        run = submit_run(project, user, {"configuration": pd_yaml("pd", sport, piddir, decode=args.decode)})
        want = 2 + args.decode

        def serving(deployment: int) -> bool:
            ready = heads(run.pk)
            return (len(ready) == want and all(j.deployment_num == deployment for j in ready)
                    and stale(run.pk, sport)[0] == 0)

        if not harness.wait_until(lambda: serving(0), args.settle_timeout, every=0.5):
            raise RuntimeError(f"the PD service was not ready and listed in {args.settle_timeout:.0f}s: "
                               f"{stale(run.pk, sport)[1]}")
        print(f"{time.time() - t0:5.1f}s service ready, smg lists its {want - 1} workers", flush=True)
        load = Load(f"{endpoint}/proxy/services/{project.name}/pd/", token, clients=args.clients,
                    bound=args.bound).start()
        sampler = ListSampler(run.pk, sport)
        sampler.start()
        time.sleep(3)
        submit_run(project, user, {"configuration": pd_yaml("pd", sport, piddir, decode=args.decode, version="v2"),
                                   "update": True})
        events.append(f"{time.time() - t0:5.1f}s update to v2 applied")
        for fault in FAULTS:
            time.sleep(max(0.5, args.fault_every + rng.uniform(-1, 1)))
            if fault == "redis":
                redis.stop()
                time.sleep(2)
                redis.start()
                events.append(f"{time.time() - t0:5.1f}s redis restarted (queued messages lost)")
            else:
                done = kill_one(run.pk, fault, piddir, rng)
                events.append(f"{time.time() - t0:5.1f}s {done}")
        for line in events:
            print("  " + line, flush=True)

        def updated() -> bool:
            fresh = Run.objects.get(pk=run.pk)
            return fresh.deployment_num >= 1 and "VERSION=v2" in fresh.submitted_text and \
                not getattr(fresh, "rollout", None) and serving(fresh.deployment_num) and \
                not Job.objects.filter(run=run, status="running", deployment_num__lt=fresh.deployment_num).exists()

        # a replica of the new revision killed before the switch rolls the update back, by design
        # (docs/services.md): the old revision serves on. Applied again once the faults are over, as
        # an operator would, up to 3 times; the update must then complete.
        reapplied, deadline, complete = 0, time.time() + args.settle_timeout, False
        while time.time() < deadline and not (complete := updated()):
            fresh = Run.objects.get(pk=run.pk)
            if fresh.deployment_num < 1 or (not getattr(fresh, "rollout", None) and "VERSION=v2"
                                            not in fresh.submitted_text):
                if reapplied == 3:
                    break
                reapplied += 1
                submit_run(project, user, {"update": True, "configuration": pd_yaml(
                    "pd", sport, piddir, decode=args.decode, version="v2")})
                print(f"{time.time() - t0:5.1f}s the update was rolled back; applied again ({reapplied})",
                      flush=True)
            time.sleep(1)
        checks["update not complete (v2 not serving, old revision running or lists unsettled)"] = 0 if complete else 1
        from events.models import Event

        for message in Event.objects.filter(run=run).order_by("id").values_list("message", flat=True):
            if any(w in message for w in ("rollout", "switched", "rolled back", "deployment")):
                print(f"  event: {message[:200]}")
        print(f"{time.time() - t0:5.1f}s {'update complete, lists settled' if complete else 'NOT settled'}",
              flush=True)
        # quiet: the lists must equal the ready workers (a bounded wait for the sweep, then counted)
        harness.wait_until(lambda: stale(run.pk, sport)[0] == 0, 10 * SWEEP + 10, every=0.5)
        count, said = stale(run.pk, sport)
        checks["stale workers in a router once quiet"] = count
        for line in said:
            print("  " + line)
        after = time.time()
        time.sleep(5)
        checks["no answer in the last 5 s"] = 0 if load.tally(after)["ok"] else 1
        load.close()
        sampler.stop.set()
        sampler.join(10)
        tally = load.tally()
        checks["requests hung past the bound"] = tally["hung past the bound"]
        checks["requests answered otherwise (4xx, no HTTP answer)"] = tally["other (4xx, no HTTP answer)"]
        checks["router lists holding two revisions"] = len(sampler.mixed)
        for line in sampler.mixed[:10]:
            print("  two revisions: " + line)
        for line in spans([a for a in load.answers if a.status != 200], t0):
            print("  " + line)

        request_stop(Run.objects.get(pk=run.pk), actor="bench")
        stopped = harness.wait_until(lambda: Run.objects.get(pk=run.pk).finished, 120, every=0.5)
        print(f"{time.time() - t0:5.1f}s service {'stopped' if stopped else 'NOT stopped in 120 s'}", flush=True)
        harness.wait_until(lambda: not [pid for pid, _, _ in started(piddir) if alive(pid)], 20, every=0.5)
        checks["replica jobs not finished after stop"] = Job.objects.filter(run=run).exclude(
            status__in=JOB_FINISHED).count()
        left = [(pid, g, a) for pid, g, a in started(piddir) if alive(pid)]
        checks["replica processes alive after stop"] = len(left)
        for pid, group, address in left:
            print(f"  alive after stop: {group} pid {pid} at {address}")
        print(f"replica processes started: {len(started(piddir))}; router list samples: {sampler.samples}")
        terminate_fleet_instances(fleet, actor="bench")
        harness.wait_until(lambda: not strays(session), 20, every=0.5)
        left = strays(session)
        checks["runner or replica processes left after stop"] = len(left)
        for pid in left:
            print(f"  left after stop: pid {pid} {Path(f'/proc/{pid}/cmdline').read_bytes()[:120]!r}")
            os.kill(pid, signal.SIGKILL)
        supervised.set()
    finally:
        if load:
            load.close()
        if sampler:
            sampler.stop.set()
        supervised.set()
        for pid in strays(session):  # an interrupted run's replicas (counted above when it got there)
            os.kill(pid, signal.SIGKILL)
        leftovers = session.teardown()
        redis.stop()
        time.sleep(0.5)
        leftovers += [pid for pid in harness.marked_processes(session.id) if pid not in leftovers]
        checks["leftover processes"] = len(leftovers)
    for line in restarts:
        print(f"  {line}")
    print(f"\n== requests: {tally}; Celery processes started again after exiting on their own: {len(restarts)}")
    width = max(len(k) for k in checks)
    print("== chaos (serving) checks (all must be 0)")
    for key, value in checks.items():
        print(f"{key.ljust(width)}  {value}")
    code = 0 if set(checks) == set(CHECKS) and not any(checks.values()) else 1
    print(f"PASS (load average {os.getloadavg()[0]:.2f})" if code == 0 else "FAIL", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
