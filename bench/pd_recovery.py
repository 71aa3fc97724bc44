"""`python -m bench.pd_recovery`: how fast a PD service gets over a killed decode worker.

A PD service (the real `smg` router, a stand-in prefill and two stand-in decodes; bench/pd_service.py)
serves `--clients` clients that POST /generate through the endpoint process back to back. `--kills`
times, a ready decode worker's server is SIGKILLed (its replica's job then fails and is retried:
`retry: on_events: [error]`), and these are timed from the kill, polled every 50 ms:

  out of smg's list   smg's GET /workers no longer lists the killed worker's URL
  last failed answer  the last request sent after the kill that got no 200 (smg still sent it to the
                      dead worker, or the endpoint had no answer); 0 when none failed
  replacement ready   a new decode job ready (probes passed) and listed by smg
  replacement serving the first 200 answered by the replacement's own process

On the local backend (`--backend local`: one loopback address per instance) and on SSH hosts in network
namespaces (`--backend ssh`: real sshd hosts, tests/sshhosts.py, needs root; the fleet registered as a
user registers one). Figures, never assertions: the medians and maxima printed, with the machine's load.
The session: its own database `muster_pd_recovery` (`--db`), a private redis-server, one Celery worker,
beat (sweep every 1 s), the endpoint; all stopped after.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import time

from bench import harness
from bench.chaos import PrivateRedis
from bench.pd_service import (
    Load,
    free_port_block,
    heads,
    pd_yaml,
    pid_at,
    session_env,
    smg_workers,
    stale,
    start_endpoint,
    strays,
)


def _s(value: float | None) -> str:
    return "never" if value is None else f"{value:.2f}s"


def _fmt(values: list[float | None]) -> str:
    got = [v for v in values if v is not None]
    if not got:
        return "-"
    missing = len(values) - len(got)
    return f"{statistics.median(got):.2f} / {max(got):.2f}" + (f" ({missing} never)" if missing else "")


def measure(project, user, token, endpoint: str, fleet: str, piddir, kills: int, clients: int, any_address: bool,
            timeout: float) -> list[dict]:
    from runs.models import Run
    from runs.services.submission import submit_run
    from runs.transitions import request_stop

    port = free_port_block()
    name = f"pd-{fleet}"
    run = submit_run(project, user, {"configuration": pd_yaml(name, port, piddir, decode=2, fleet=fleet,
                                                              any_address=any_address)})

    def whole() -> bool:
        return len(heads(run.pk)) == 4 and stale(run.pk, port)[0] == 0

    t0 = time.time()
    if not harness.wait_until(whole, timeout, every=0.5):
        raise RuntimeError(f"{name} not ready and listed in {timeout:.0f}s: {stale(run.pk, port)[1]}")
    print(f"  {name}: ready and listed {time.time() - t0:.1f}s after submit", flush=True)
    load = Load(f"{endpoint}/proxy/services/{project.name}/{name}/", token, clients=clients, bound=30).start()
    rows = []
    try:
        time.sleep(3)
        for k in range(kills):
            ready = heads(run.pk)
            router = next(j for j in ready if j.node_group_name == "router").instance.internal_ip
            decodes = [j for j in ready if j.node_group_name == "decode"]
            victim = decodes[k % len(decodes)]
            address = victim.instance.internal_ip
            url, pid = f"http://{address}:{port}", pid_at(piddir, address)
            before = {j.pk for j in decodes}
            old = {f"decode@{j.instance.internal_ip}#{pid_at(piddir, j.instance.internal_ip)}" for j in decodes}
            killed = time.time()
            os.kill(pid, signal.SIGKILL)
            out = listed = serving = None
            deadline = killed + timeout
            while time.time() < deadline and (out is None or listed is None or serving is None):
                now = time.time()
                got = smg_workers(router, port, timeout=2) or set()
                if out is None and url not in {u for u, _ in got}:
                    out = now - killed
                if listed is None:
                    new = [j for j in heads(run.pk) if j.node_group_name == "decode" and j.pk not in before]
                    if new and f"http://{new[0].instance.internal_ip}:{port}" in {u for u, _ in got}:
                        listed = now - killed
                if serving is None:
                    with load.lock:
                        first = [a for a in load.answers if a.at >= killed and a.status == 200
                                 and a.served_by.startswith("decode@") and a.served_by not in old]
                    if first:
                        serving = min(a.at + a.took for a in first) - killed
                time.sleep(0.05)
            with load.lock:
                after = [a for a in load.answers if a.at >= killed]
            failed = [a for a in after if a.status != 200]
            last = max((a.at + a.took for a in failed), default=killed) - killed
            rows.append({"kill": k + 1, "out_of_list_s": out, "last_failed_s": last, "failed": len(failed),
                         "answers": len(after), "replacement_ready_s": listed, "replacement_serving_s": serving})
            print(f"    kill {k + 1}: out of smg's list {_s(out)}, last failed answer {last:.2f}s "
                  f"({len(failed)} of {len(after)} failed), replacement ready+listed {_s(listed)}, "
                  f"serving {_s(serving)}", flush=True)
            harness.wait_until(whole, timeout, every=0.5)
            time.sleep(2)
    finally:
        load.close()
        request_stop(Run.objects.get(pk=run.pk), actor="bench")
        harness.wait_until(lambda: Run.objects.get(pk=run.pk).finished, 120, every=0.5)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.pd_recovery", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", action="append", choices=("local", "ssh"), help="both when not given")
    p.add_argument("--kills", type=int, default=3)
    p.add_argument("--clients", type=int, default=2)
    p.add_argument("--timeout", type=float, default=180.0)
    p.add_argument("--db", default="muster_pd_recovery")
    args = p.parse_args(argv)
    backends = args.backend or ["local", "ssh"]
    port = harness.free_port()
    session = harness.Session(db_name=args.db, redis_url=f"redis://127.0.0.1:{port}", redis_db=0, count=False,
                              extra_env={"MUSTER_SWEEP_INTERVAL": "1", "MUSTER_DRAIN_DELAY": "1", **session_env()})
    redis = PrivateRedis(port, session.id)
    load0 = os.getloadavg()
    print(f"pd_recovery: session {session.id}; load average {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f} on "
          f"{os.cpu_count()} CPUs; {args.kills} kills per backend, {args.clients} clients", flush=True)
    results: dict[str, list[dict]] = {}
    pool = None
    try:
        redis.start()
        session.setup()
        from bench.scenarios.common import project_with_user
        from engine.groups import terminate_fleet_instances
        from instances.services.fleets import create_local_fleet

        session.start_worker("worker0", 3)
        session.start_beat()
        endpoint = start_endpoint(session)
        project, user, token = project_with_user("recovery", superuser=True)
        for backend in backends:
            piddir = session.data_dir / backend
            piddir.mkdir()
            if backend == "local":
                fleet = create_local_fleet(project, "local", 6, placement="cluster")
            else:
                from tests.ssh_e2e.helpers import fleet_configuration, registered_fleet
                from tests.sshhosts import SSHHostPool

                pool = SSHHostPool(5, mode="netns")
                pool.start()
                fleet = registered_fleet(project, {"configuration": fleet_configuration(pool, name="ssh")},
                                         actor="bench")
                if fleet.status != "active":
                    raise RuntimeError(f"the SSH fleet did not register: {fleet.errors}")
            print(f"{backend}:", flush=True)
            results[backend] = measure(project, user, token, endpoint, fleet.name, piddir, args.kills, args.clients,
                                       backend == "ssh", args.timeout)
            terminate_fleet_instances(fleet, actor="bench")
    finally:
        for pid in strays(session):  # local runner jobs left by an interrupted run
            os.kill(pid, signal.SIGKILL)
        session.teardown()
        redis.stop()
        if pool is not None:
            pool.close()
    load1 = os.getloadavg()
    print(f"\n== a killed decode worker (seconds from the SIGKILL, median / max of {args.kills}); "
          f"load average {load0[0]:.2f} at start, {load1[0]:.2f} at end, {os.cpu_count()} CPUs")
    print(f"{'backend':8} {'out of smg list':>16} {'last failed':>14} {'failed/answers':>15} "
          f"{'replacement ready':>18} {'replacement serving':>20}")
    for backend, rows in results.items():
        failed = f"{sum(r['failed'] for r in rows)}/{sum(r['answers'] for r in rows)}"
        print(f"{backend:8} {_fmt([r['out_of_list_s'] for r in rows]):>16} "
              f"{_fmt([r['last_failed_s'] for r in rows]):>14} {failed:>15} "
              f"{_fmt([r['replacement_ready_s'] for r in rows]):>18} {_fmt([r['replacement_serving_s'] for r in rows]):>20}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
