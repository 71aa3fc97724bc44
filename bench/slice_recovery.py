"""Slice recovery: from one slice of a multislice set preempted to every job of the set running
again, whole-set (the default) against `on_slice_failure: replace-slice`, for sets of 2, 4 and 8
v4-16 slices (2 hosts each).

Real processes (PostgreSQL, Redis, `celery worker` and `celery beat` with the product's schedule,
bench/harness.py); the real gcp backend and google-cloud-tpu client against the fake TPU API
(tests/fake_tpu/, served from this process), whose nodes take `--creation` seconds to go READY
(Google takes minutes; GKE re-forms a sub-slice in 42-58 s); namespace sshd hosts (tests/sshhosts.py,
needs root), slice i on hosts 2i, 2i+1, a new slice on the same addresses. Those hosts keep
answering SSH after the preemption, as a preempted VM may for a while, and keep their runner agent,
so `start` has no runner install in it (a fresh VM's first install is measured in `start`, the
warm-start scenario of bench/run.py).

Each case: submit, wait until every job runs, preempt slice 1 (`PREEMPTED` at the fake), then poll
the database and the fake every 50 ms for the phases:

  detection  preemption -> the first job of the set ends as an interruption (the pod watch)
  teardown   detection -> every job of the first submission ended (and, whole-set, every slice
             of the set deleted)
  request    detection -> the first create call for a new slice (whole-set: includes the run's
             retry backoff, RETRY_BACKOFF[0]); overlaps teardown
  creation   the first new create -> the last new create + the fake's delay (Google's share,
             reported apart; with whole-set the set's creates are a few tenths apart)
  start      that moment -> every job of the set running again: the pod poll noticing READY (the
             fake flips a node on the first look after its delay; `ready seen after` says how
             late), the hosts filled in, runners up, the jobs handed their specs
  muster     total less creation: everything Muster does itself (aim: <= 15 s)

  python -m bench.slice_recovery [--slices 2,4,8] [--creation 30] [--modes whole-set,replace-slice]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from bench import harness

AIM = 15.0
ZONES = ["bench-a", "bench-b"]
HOSTS_PER_SLICE = 2  # v4-16


def _slice_index(node_id: str) -> int:
    head, sep, tail = node_id.rpartition("-s-")
    return int(tail) if sep and tail.isdigit() else 0


class Case:
    """One measurement: a run of `slices` slices under `mode`, slice 1 preempted once it runs."""

    def __init__(self, fake, pool, project, user, slices: int, mode: str, creation: float, poll: float):
        self.fake, self.pool, self.project, self.user = fake, pool, project, user
        self.slices, self.mode, self.creation, self.poll = slices, mode, creation, poll
        self.name = f"rec-{mode}-{slices}"

    def run(self, timeout: float) -> dict:
        from instances.models import InstanceGroup
        from runs.models import Job, Run
        from runs.services.submission import submit_run

        lines = ["type: task", f"name: {self.name}", "fleets: [tpu]", "resources: {gpu: tpu-v4-16}",
                 f"slices: {self.slices}", f"on_slice_failure: {self.mode}", "commands: [sleep 3600]",
                 "retry: {on_events: [interruption], duration: 1h}"]
        submit_run(self.project, self.user, {"configuration": "\n".join(lines) + "\n"})
        jobs = self.slices * HOSTS_PER_SLICE
        if not harness.wait_until(lambda: Job.objects.filter(run__name=self.name, status="running",
                                                             submission_num=0).count() == jobs, timeout, every=0.2):
            raise RuntimeError(f"{self.name}: the set never ran")
        pod = InstanceGroup.objects.get(kind="tpu_pod", status="active", instances__jobs__run__name=self.name,
                                        instances__index=0)
        old = set(self.fake.nodes)
        victim = next(n for n in old if n.endswith(f"{pod.name}-s-1"))
        remade = range(self.slices) if self.mode == "whole-set" else [1]
        self.fake.creation_seconds = self.creation
        t0 = time.time()
        with self.fake.lock:
            self.fake.set_state(victim, "PREEMPTED")
        marks: dict[str, float] = {}
        deadline = t0 + timeout
        while time.time() < deadline:
            now = time.time()
            first = list(Job.objects.filter(run__name=self.name, submission_num=0).values_list(
                "status", "termination_reason"))
            if "detect" not in marks and any(r == "interrupted_by_no_capacity" for _, r in first):
                marks["detect"] = now
            deleted = self.mode != "whole-set" or not (old & set(self.fake.nodes))
            if "detect" in marks and "teardown" not in marks and deleted and all(
                    s in ("terminated", "failed", "aborted", "done") for s, _ in first):
                marks["teardown"] = now
            with self.fake.lock:
                new = {n: t for n, t in self.fake.created_at.items() if t >= t0}
                ready = [self.fake.nodes[n].ready_at for n in new if n in self.fake.nodes]
            if new and "request" not in marks:
                marks["request"] = min(new.values())
            if len(new) >= len(remade) and ready and all(r is not None for r in ready) and "ready" not in marks:
                # Google's share ends when the last new slice could be READY (its create + the
                # delay); the fake flips it on the next look, so the poll's lag is Muster's (start)
                marks["ready"] = max(new.values()) + self.creation
                marks["seen ready"] = max(ready)
            run = Run.objects.get(name=self.name)
            current = list(Job.objects.filter(run=run, superseded=False, submission_num__gt=0)
                           .values_list("status", flat=True))
            if len(current) == jobs and all(s == "running" for s in current) and "ready" in marks:
                marks["running"] = now
                break
            time.sleep(0.05)
        self.fake.creation_seconds = 0.0
        if "running" not in marks:
            raise RuntimeError(f"{self.name}: not running again within {timeout:.0f}s: {marks}")
        marks.update(self._from_events(marks))
        out = {"slices": self.slices, "mode": self.mode, "total": marks["running"] - t0,
               "detection": marks["detect"] - t0, "teardown": marks.get("teardown", marks["detect"]) - marks["detect"],
               "request": marks["request"] - marks["detect"], "creation": marks["ready"] - marks["request"],
               "start": marks["running"] - marks["ready"], "ready seen after": marks["seen ready"] - marks["ready"],
               "new slices": len(remade),
               "kept slices": self.slices - len(remade)}
        out["muster"] = out["total"] - out["creation"]
        self.stop()
        return out

    def _from_events(self, polled: dict[str, float]) -> dict[str, float]:
        """The job marks as the engine wrote them (each move's event, committed with it), which a
        driver polling on a loaded machine sees late; the polled ones stay where none is found."""
        from django.db.models import Max, Min

        from events.models import Event
        from runs.models import Job

        first = list(Job.objects.filter(run__name=self.name, submission_num=0).values_list("pk", flat=True))
        again = list(Job.objects.filter(run__name=self.name, superseded=False, submission_num__gt=0)
                     .values_list("pk", flat=True))
        stamps = {
            "detect": Event.objects.filter(job_id__in=first, status="terminating").aggregate(t=Min("created"))["t"],
            "teardown": Event.objects.filter(job_id__in=first, status__in=["terminated", "failed", "aborted"])
            .aggregate(t=Max("created"))["t"],
            "running": Event.objects.filter(job_id__in=again, status="running").aggregate(t=Max("created"))["t"],
        }
        out = {k: v.timestamp() for k, v in stamps.items() if v is not None}
        if self.mode == "whole-set" and "teardown" in out:
            out["teardown"] = max(out["teardown"], polled.get("teardown", 0.0))  # (the slices' deletes: polled)
        return out

    def stop(self) -> None:
        from runs.models import Run
        from runs.transitions import request_stop

        run = Run.objects.get(name=self.name)
        request_stop(run)
        from engine import messages  # the stop is acted on by process_run

        messages.process_run(run.pk)
        harness.wait_until(lambda: Run.objects.get(pk=run.pk).status in ("terminated", "failed", "done"), 120)
        for host in self.pool:
            host.kill_processes(keep_sshd=True)


def table(rows: list[dict]) -> str:
    cols = ["slices", "mode", "detection", "teardown", "request", "creation", "start", "total", "muster"]
    out = ["| " + " | ".join(cols) + " | aim |", "|" + "---|" * (len(cols) + 1)]
    for r in rows:
        cells = [str(r[c]) if isinstance(r[c], (int, str)) else f"{r[c]:.1f}" for c in cols]
        out.append("| " + " | ".join(cells) + f" | {'met' if r['muster'] <= AIM else 'missed'} (<= {AIM:.0f} s) |")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.slice_recovery", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--slices", default="2,4,8")
    p.add_argument("--modes", default="whole-set,replace-slice")
    p.add_argument("--creation", type=float, default=30.0, help="seconds the fake takes to make a slice")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--db", default="muster_slice_recovery")
    p.add_argument("--redis-db", type=int, default=int(os.environ.get("BENCH_REDIS_DB", "15")))
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.slices.split(",")]
    modes = args.modes.split(",")
    if os.geteuid() != 0:
        print("needs root: the TPU hosts are sshd in network namespaces", file=sys.stderr)
        return 2
    sys.path.insert(0, str(harness.ROOT))
    from tests.fake_tpu import FakeTpuServer
    from tests.sshhosts import SSHHostPool

    pool = SSHHostPool(max(sizes) * HOSTS_PER_SLICE, mode="netns")
    pool.start()
    addresses = [str(h.address) for h in pool]
    fake = FakeTpuServer()
    fake.host_addresses = lambda node_id, hosts: addresses[_slice_index(node_id) * hosts:
                                                           (_slice_index(node_id) + 1) * hosts]
    fake.start()
    key = pool.private_key_path
    session = harness.Session(db_name=args.db, redis_db=args.redis_db, extra_env={
        "BENCH_POLL_INTERVAL": "1.0",  # the product's JOB_POLL_INTERVAL, so the pod watch is its 5 s
        "MUSTER_GCP_PROJECT_ID": "bench", "MUSTER_GCP_ZONES": ",".join(ZONES),
        "MUSTER_GCP_API_ENDPOINT": fake.endpoint, "MUSTER_GCP_TIMEOUT": "5",
        "MUSTER_GCP_SSH_USER": pool.user, "MUSTER_GCP_SSH_PRIVATE_KEY": str(key)})
    os.environ.update({k: v for k, v in session.env.items() if k.startswith("MUSTER_GCP_")})
    rows: list[dict] = []
    try:
        session.setup()
        session.start_worker("worker", 4)
        session.start_beat()
        from django.conf import settings

        from bench.scenarios.common import project_with_user
        from engine.pods import poll_interval
        from instances.models import Fleet

        project, user, _ = project_with_user("slices")
        Fleet.objects.create(project=project, name="tpu", backend="gcp", idle_duration=None, configuration={
            "type": "fleet", "name": "tpu", "backends": ["gcp"], "zones": ZONES, "spot": True})
        watch = poll_interval()
        print(f"slice recovery: {len(pool)} namespace hosts, fake creation {args.creation:.0f}s, pod watch every "
              f"{watch:.0f}s, retry backoff {settings.MUSTER['RETRY_BACKOFF'][0]}s", flush=True)
        for slices in sizes:
            for mode in modes:
                row = Case(fake, pool, project, user, slices, mode, args.creation, watch).run(args.timeout)
                rows.append(row)
                print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
        print(table(rows))
        out = harness.ROOT / "bench" / "results" / f"slice-recovery-{time.strftime('%Y%m%d-%H%M%S')}.json"
        out.parent.mkdir(exist_ok=True)
        out.write_text(json.dumps({"creation": args.creation, "watch": watch, "rows": rows}, indent=1))
        return 0 if all(r["muster"] <= AIM for r in rows if r["mode"] == "replace-slice") else 1
    finally:
        for name in ("worker", "beat"):  # kept for a look after the session's data dir is gone
            log = session.data_dir / f"{name}.log"
            if log.exists():
                (Path(tempfile.gettempdir()) / f"slice-recovery-{name}.log").write_bytes(log.read_bytes())
        session.teardown()
        fake.stop()
        pool.close()


if __name__ == "__main__":
    sys.exit(main())
