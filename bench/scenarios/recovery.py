"""recovery: after `kill -9` of a worker holding claimed rows, how long until every row it held is
picked up again (target: within 30 s), and whether anything ran twice.

The product's MUSTER["LEASE_SECONDS"] and MUSTER["SWEEP_INTERVAL"] are used as they are (not
overridden, so the figure is what users get), unless --lease-seconds names a what-if lease. One
worker (--concurrency children) and beat; hollow jobs run HOLLOW_RUN s here (set for this
scenario's workers only), so jobs are still being placed, started and watched at the kill.

Each of --kills rounds (3): submit RUNS runs (1 and 2 nodes alternately) to a hollow fleet, wait
KILL_AFTER s (2, 8, 15 in turn), then for a moment when the worker holds claims (Job/Run rows of the project with lease_until in the
future and a lease_token), SIGKILL its whole process group, and start a fresh worker at once.
The rows measured are those still leased once every killed process is gone (only the dead worker
can hold a lease then); the rows read just before the kill are reported too. Each row is polled
every POLL s until it was picked up: its lease_token is no longer the dead worker's (another worker
claimed it; the token is then a new one, or empty when that worker already gave it back between
two polls, since only a token's holder can release it) or its status changed.

Ran twice: the hollow runner keeps one JSON file per instance, {runner job id: submit time}; the
files of the fleet are read every SCAN s, and a runner job id seen on two instances, or with two
submit times (submitted again after its cleanup), ran twice. Also sampled: instances with two live
jobs; at the end every run must be `done`.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import statistics
import threading
import time
from collections import Counter

from bench import harness, instrument
from bench.hollow import make_hollow_fleet, state_dir
from bench.scenarios.common import project_with_user, table, task_yaml
from bench.scenarios.start import pause_workers, resume_workers

TARGET = 30.0
H = 240
RUNS = 40  # 60 jobs per round: enough watch traffic at a 0.5 s poll to keep every child busy
HOLLOW_RUN = 30.0
PICKUP_CAP = 120.0
POLL = 0.1
SCAN = 0.25
# seconds after a round's submit to start looking for the moment to kill: early rounds catch
# placement (provision_job), later ones the start and the watch (advance_job, process_run)
KILL_AFTER = (2.0, 8.0, 15.0)


class RunnerFiles:
    """What the hollow runner was handed, as seen by reading its files often."""

    def __init__(self, instance_pks: list[int]):
        self.paths = {pk: state_dir() / f"{pk}.json" for pk in instance_pks}
        self.seen: dict[str, set[tuple[int, float]]] = {}
        self.last = 0.0

    def scan(self, force: bool = False) -> None:
        if not force and time.time() - self.last < SCAN:
            return
        self.last = time.time()
        for pk, path in self.paths.items():
            try:
                jobs = json.loads(path.read_text())
            except (OSError, ValueError):  # not written yet
                continue
            for job_id, submitted in jobs.items():
                self.seen.setdefault(job_id, set()).add((pk, submitted))

    def twice(self) -> dict[str, list]:
        return {job_id: sorted(v) for job_id, v in self.seen.items() if len(v) > 1}


class Checks:
    """Invariants sampled while the scenario runs (the hollow files, hosts shared by live jobs)."""

    def __init__(self, project, files: RunnerFiles):
        self.project, self.files = project, files
        self.two_live_max = 0
        self.last = 0.0

    def sample(self) -> None:
        from django.db.models import Count

        from runs.choices import JOB_ACTIVE
        from runs.models import Job

        self.files.scan()
        if time.time() - self.last < 1.0:
            return
        self.last = time.time()
        shared = Job.objects.filter(run__project=self.project, status__in=[*JOB_ACTIVE, "terminating"],
                                    instance__isnull=False).values("instance").annotate(n=Count("id")).filter(n__gt=1)
        self.two_live_max = max(self.two_live_max, shared.count())


def leased(project) -> dict[tuple[str, int], tuple[str, str]]:
    """{(kind, pk): (lease_token, status)} of the project's rows somebody holds now."""
    from django.utils import timezone

    from runs.models import Job, Run

    now = timezone.now()
    out = {}
    for kind, qs in (("job", Job.objects.filter(run__project=project)), ("run", Run.objects.filter(project=project))):
        for pk, token, status in qs.filter(lease_until__gt=now).exclude(lease_token="").values_list(
                "pk", "lease_token", "status"):
            out[(kind, pk)] = (token, status)
    return out


def current(keys) -> dict[tuple[str, int], tuple[str, str]]:
    from runs.models import Job, Run

    out = {}
    for kind, model in (("job", Job), ("run", Run)):
        pks = [pk for k, pk in keys if k == kind]
        if pks:
            for pk, token, status in model.objects.filter(pk__in=pks).values_list("pk", "lease_token", "status"):
                out[(kind, pk)] = (token, status)
    return out


def wait_for_claims(project, want: int, checks: Checks, patience: float = 8.0, cap: float = 20.0) -> dict:
    """The first moment the worker holds `want` claims (after `patience` s, any one will do)."""
    t0 = time.time()
    while time.time() - t0 < cap:
        held = leased(project)
        if len(held) >= (want if time.time() - t0 < patience else 1):
            return held
        checks.files.scan()
        time.sleep(0.003)
    raise RuntimeError(f"the worker held no claim for {cap:.0f} s")


def kill_group(session: harness.Session, name: str, pids: list[int]) -> list[int]:
    """SIGKILL the worker's process group and wait until every process of it (`pids`, read
    beforehand: walking /proc takes long enough for the claims just read to be given back) is gone."""
    proc = session.procs.pop(name)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    proc._bench_log.close()  # type: ignore[attr-defined]
    # the prefork children die as the kernel gets to them; a claim they committed stays, one they
    # had not committed is rolled back when PostgreSQL sees the connection close
    harness.wait_until(lambda: not any(_alive(p) for p in pids), 5, every=0.01)
    return pids


def _alive(pid: int) -> bool:
    st = harness._stat(pid)
    return st is not None and st[0] != "Z"  # a zombie holds no connection any more


def one_round(session: harness.Session, project, user, name: str, names, concurrency: int,
              checks: Checks, after: float) -> dict:
    """Kill worker `name` while it holds claims and follow them; `names` gives fresh worker names
    (each process its own log, so a " ready." of the last one is never taken for the next)."""
    from runs.services.submission import submit_run

    for i in range(RUNS):
        submit_run(project, user, {"configuration": task_yaml(1 + i % 2)})
    time.sleep(after)
    misses = 0
    while True:
        pids = harness.tree(session.procs[name].pid)
        before = wait_for_claims(project, max(1, concurrency // 2), checks)
        kill_group(session, name, pids)
        t_kill = time.time()
        held = leased(project)  # only the dead worker can hold a lease now
        fresh = next(names)
        if held or misses == 3:
            break
        # every claim read was given back before the kill landed: nothing to follow, try again
        misses += 1
        session.start_worker(fresh, concurrency)
        name = fresh
    started: dict = {}
    # start_worker blocks until " ready."; the rows are polled meanwhile
    thread = threading.Thread(target=lambda: started.update(proc=session.start_worker(fresh, concurrency),
                                                            at=time.time() - t_kill))
    thread.start()
    pending, picked = dict(held), {}
    while pending and time.time() - t_kill < PICKUP_CAP:
        now_rows = current(pending)
        t = time.time() - t_kill
        for key, (token, status) in list(pending.items()):
            row = now_rows.get(key)
            if row is None or row != (token, status):
                how = "gone" if row is None else (f"status {status} -> {row[1]}" if row[1] != status
                                                  else "claimed" if row[0] else "claimed and released")
                picked[key] = {"s": t, "how": how}
                del pending[key]
        checks.sample()
        time.sleep(POLL)
    thread.join()
    return {
        "before_kill": len(before), "released_before_kill": sum(1 for k, v in before.items() if held.get(k) != v),
        "held": {f"{k}:{pk}": status for (k, pk), (_, status) in held.items()},
        "picked": {f"{k}:{pk}": v for (k, pk), v in picked.items()},
        "not_picked": [f"{k}:{pk}" for k, pk in pending], "fresh_worker_ready_s": started.get("at"),
        "kill_after_submit_s": after, "kills_that_caught_nothing": misses, "fresh_worker": fresh,
    }


def settle(project, checks: Checks, timeout: float) -> bool:
    from runs.models import Run

    def done() -> bool:
        checks.sample()
        return not Run.objects.filter(project=project).exclude(status__in=["done", "failed", "terminated"]).exists()

    return bool(harness.wait_until(done, timeout, every=POLL))


def run(session: harness.Session, args) -> dict:
    from django.conf import settings
    from django.db.models import Count

    from instances.models import Instance
    from runs.models import Job, Run

    kills = getattr(args, "kills", None) or 3
    what_if = getattr(args, "lease_seconds", None)
    lease = what_if or float(settings.MUSTER["LEASE_SECONDS"])
    sweep = float(settings.MUSTER["SWEEP_INTERVAL"])
    origin = "what-if (--lease-seconds), NOT the product default" if what_if else (
        "MUSTER_LEASE_SECONDS from the environment" if "MUSTER_LEASE_SECONDS" in os.environ else "product default")
    paused = pause_workers(session)
    saved = {k: session.env.get(k) for k in ("BENCH_HOLLOW_RUN_SECONDS", "MUSTER_LEASE_SECONDS")}
    session.env["BENCH_HOLLOW_RUN_SECONDS"] = str(HOLLOW_RUN)
    if what_if:
        session.env["MUSTER_LEASE_SECONDS"] = str(what_if)
    rounds: list[dict] = []
    instrument.reset(session.redis())  # task times below are this scenario's
    names = (f"rworker{i}" for i in itertools.count())
    name = next(names)
    try:
        project, user, _ = project_with_user(f"recovery-{int(time.time())}")
        fleet = make_hollow_fleet(project, "hollow-recovery", H)
        pks = list(Instance.objects.filter(fleet=fleet).values_list("pk", flat=True))
        checks = Checks(project, RunnerFiles(pks))
        session.start_worker(name, args.concurrency)
        if "beat" not in session.procs:
            session.start_beat()
        for r in range(kills):
            result = one_round(session, project, user, name, names, args.concurrency, checks,
                               KILL_AFTER[r % len(KILL_AFTER)])
            rounds.append(result)
            name = result["fresh_worker"]
            times = [p["s"] for p in result["picked"].values()]
            kinds = Counter(f"{key.split(':')[0]} {status}" for key, status in result["held"].items())
            hows = Counter(p["how"] for p in result["picked"].values())
            print(f"  kill {r + 1}: held {dict(kinds)}; picked up after {min(times, default=0):.1f}-"
                  f"{max(times, default=0):.1f} s ({dict(hows)}); not picked up {result['not_picked']}", flush=True)
        settled = settle(project, checks, args.timeout)
        checks.files.scan(force=True)
        statuses = dict(Run.objects.filter(project=project).values_list("status").annotate(n=Count("id")))
        reasons = dict(Job.objects.filter(run__project=project).exclude(termination_reason="done_by_runner")
                       .values_list("termination_reason").annotate(n=Count("id")))
        job_ids = [f"{n}-{s}-{j}" for n, s, j in Job.objects.filter(run__project=project, runner_submitted=True)
                   .values_list("run__name", "submission_num", "job_num")]
        unseen = [j for j in job_ids if j not in checks.files.seen]
        task_ms = {k.split(".")[-1]: round(v["ms"] / v["calls"], 1)
                   for k, v in instrument.read(session.redis()).items() if v["calls"]}
    finally:
        for proc_name in [n for n in session.procs if n.startswith("rworker")]:
            session.stop(proc_name, grace=60)
        for key, value in saved.items():
            if value is None:
                session.env.pop(key, None)
            else:
                session.env[key] = value
        resume_workers(session, paused, args.concurrency)
    times = [p["s"] for r in rounds for p in r["picked"].values()]
    not_picked = sum(len(r["not_picked"]) for r in rounds)
    twice = checks.files.twice()
    runs_not_done = sum(n for s, n in statuses.items() if s != "done")
    rows = [[i + 1, r["kill_after_submit_s"], r["kills_that_caught_nothing"], r["before_kill"], r["released_before_kill"], len(r["held"]),
             ", ".join(sorted(set(r["held"].values()))) or "-", r["fresh_worker_ready_s"] or "-",
             min((p["s"] for p in r["picked"].values()), default="-"),
             statistics.median([p["s"] for p in r["picked"].values()]) if r["picked"] else "-",
             max((p["s"] for p in r["picked"].values()), default="-"), len(r["not_picked"])]
            for i, r in enumerate(rounds)]
    text = table(f"recovery: SIGKILL of a worker holding claims; lease {lease:g} s ({origin}), sweep every "
                 f"{sweep:g} s; seconds from the kill until each held row was picked up",
                 ["kill", "looked from s", "kills that caught nothing", "leased before", "released before kill", "rows held", "held (status)",
                  "new worker ready s", "min s", "median s", "max s", f"not picked up <= {PICKUP_CAP:.0f} s"], rows)
    top = max(times, default=None)
    summary = [[len(times) + not_picked, statistics.median(times) if times else "-", top if top is not None else "-",
                "yes" if top is not None and top <= TARGET and not not_picked else "NO", not_picked, len(twice),
                checks.two_live_max, runs_not_done if settled else f"{runs_not_done} (not settled)", len(unseen)]]
    text += table(f"recovery: all kills (target: every held row picked up within {TARGET:.0f} s, nothing runs twice)",
                  ["rows held", "median s", "max s", f"<= {TARGET:.0f} s", "not picked up", "ran twice",
                   "instances w/ 2 live jobs", "runs not done", "jobs unseen by runner scan"], summary)
    print(f"runs by status: {statuses}; job reasons other than done_by_runner: {reasons}", flush=True)
    # how long a task (and so, about, its claim) lasts on hollow hosts, for the lease audit
    print(f"mean ms per task call in this scenario: {task_ms}", flush=True)
    return {"lease_seconds": lease, "lease_origin": origin, "sweep_interval": sweep, "hollow_run_s": HOLLOW_RUN,
            "runs_per_round": RUNS, "H": H, "rounds": rounds, "median_s": statistics.median(times) if times else None,
            "max_s": top, "not_picked_up": not_picked, "ran_twice": twice, "instances_two_live_jobs_max":
            checks.two_live_max, "run_statuses": statuses, "job_reasons": reasons, "settled": settled,
            "jobs_unseen_by_scan": unseen, "task_mean_ms": task_ms, "table": text}
