"""start: seconds from spawning a process until it is ready to work, warm (target: <= 3 s).

Warm: the database is migrated, the package installed, and one throwaway start of each kind
comes first so the interpreter, Django and Celery files are in the OS page cache. Then, --reps
times each (5):

* web: gunicorn exactly as harness.start_web starts it (2 processes x 4 threads), from spawn to the
  first HTTP 200 from /healthz (the view runs SELECT 1, so the database connection is included);
* worker: celery exactly as harness.start_worker starts it (--concurrency children), from spawn to
  its " ready." log line, and to the end of a `engine.tasks.sweep` sent at spawn (a real broker ->
  worker -> database round trip, seen in the bench's per-task counters); ready to work = the later;
* serve: `muster serve` as a user runs it (embedded SQLite + filesystem broker in a scratch data
  directory: migrate, bootstrap, then gunicorn + worker + beat), from spawn to the first HTTP 200
  from /healthz, and to its worker's " ready." line.

The session's workers and beat are stopped meanwhile (the probe must be taken by the worker being
timed, and beat's sweeps would be counted as the probe) and started again at the end.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from bench import harness
from bench.scenarios.common import table

TARGET = 3.0
POLL = 0.02  # fine enough against a 3 s target, cheap enough not to slow the start being timed
LIMIT = 120.0  # a start slower than this is a failure, not a figure
PROBE = "engine.tasks.sweep"


# --- the session's own processes, out of the way and back --------------------------------------

def pause_workers(session: harness.Session) -> dict:
    """Stop the session's workers and beat; what was running, for resume_workers."""
    names = [n for n in session.procs if n.startswith("worker")]
    beat = "beat" in session.procs
    for name in [*names, *(["beat"] if beat else [])]:
        session.stop(name, grace=60)
    return {"workers": names, "beat": beat}


def resume_workers(session: harness.Session, paused: dict, concurrency: int) -> None:
    for name in paused["workers"]:
        session.start_worker(name, concurrency)
    if paused["beat"] and "beat" not in session.procs:
        session.start_beat()


# --- one start -----------------------------------------------------------------------------------

def _http_ok(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
            return response.status == 200
    except OSError:  # refused while nothing listens yet; HTTPError (5xx while starting) is one too
        return False


def _logged(session: harness.Session, name: str, text: str) -> bool:
    return _count_in(session.data_dir / f"{name}.log", text) > 0


def _count_in(path: Path, text: str) -> int:
    try:
        return path.read_text(errors="replace").count(text)
    except FileNotFoundError:
        return 0


def _until(session: harness.Session, name: str, proc, t0: float, checks: dict) -> dict[str, float]:
    """Poll every check until all are true; seconds from t0 at which each first was."""
    seen: dict[str, float] = {}
    while len(seen) < len(checks):
        for key, check in checks.items():
            if key not in seen and check():
                seen[key] = time.perf_counter() - t0
        if len(seen) == len(checks):
            break
        if proc.poll() is not None or time.perf_counter() - t0 > LIMIT:
            tail = (session.data_dir / f"{name}.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{name} not ready ({sorted(set(checks) - set(seen))} missing):\n{tail}")
        time.sleep(POLL)
    return seen


def web_once(session: harness.Session, name: str) -> dict[str, float]:
    # harness.start_web's command line; not called itself because it picks the port inside and
    # polls at 0.2 s
    port = harness.free_port()
    cmd = [str(Path(sys.executable).parent / "gunicorn"), "muster.wsgi:application", "-b", f"127.0.0.1:{port}",
           "-w", "2", "--threads", "4", "--preload", "--access-logfile", "-"]
    t0 = time.perf_counter()
    proc = session.start(name, cmd)
    try:
        return _until(session, name, proc, t0, {"http_200_s": lambda: _http_ok(port)})
    finally:
        session.stop(name)


def worker_once(session: harness.Session, name: str, concurrency: int) -> dict[str, float]:
    from engine.tasks import sweep
    from muster.celery import app

    app.control.purge()  # leftovers of earlier scenarios would run first and be counted
    redis = session.redis()

    def probes() -> int:
        return int(redis.hget("bench:n", PROBE) or 0)

    before = probes()
    # harness.start_worker's command line; not called itself because it blocks until ready (0.1 s polls)
    cmd = [sys.executable, "-m", "celery", "-A", "muster", "worker", "--loglevel=INFO", f"--concurrency={concurrency}",
           "--without-gossip", "--without-mingle", "--without-heartbeat", "-n", f"{name}-{session.id}@%h"]
    t0 = time.perf_counter()
    proc = session.start(name, cmd)
    sweep.delay()  # waits in the broker until the worker takes it
    try:
        seen = _until(session, name, proc, t0, {"ready_log_s": lambda: _logged(session, name, " ready."),
                                                "task_done_s": lambda: probes() > before})
    finally:
        session.stop(name)
    seen["ready_to_work_s"] = max(seen.values())
    return seen


def serve_env(session: harness.Session, data_dir: Path) -> dict[str, str]:
    """What a user's `muster serve` sees: product settings, embedded store, nothing of the bench's
    but the session mark (so leftovers are still found)."""
    env = {**os.environ, **session.env, "MUSTER_DATA_DIR": str(data_dir), "DJANGO_SETTINGS_MODULE": "muster.settings"}
    for key in ("DATABASE_URL", "CELERY_BROKER_URL", "BENCH_STATS_URL"):
        env.pop(key, None)
    return env


def serve_once(session: harness.Session, name: str, data_dir: Path) -> dict[str, float]:
    port = harness.free_port()
    logf = open(session.data_dir / f"{name}.log", "ab")  # noqa: SIM115 - closed by session.stop
    worker_log = data_dir / "serve-logs" / "worker.log"
    readies_before = _count_in(worker_log, " ready.")
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "cli", "serve", "--bind", f"127.0.0.1:{port}"],
                            cwd=harness.ROOT, env=serve_env(session, data_dir), stdout=logf,
                            stderr=subprocess.STDOUT, start_new_session=True)
    proc._bench_log = logf  # type: ignore[attr-defined]
    session.procs[name] = proc
    children: list[int] = []
    try:
        seen = _until(session, name, proc, t0, {
            # serve prints its banner once migrate and bootstrap are done, before starting its children
            "banner_s": lambda: _logged(session, name, "Muster: console"),
            "http_200_s": lambda: _http_ok(port),
            # quiet by default: the worker's lines go to serve-logs/worker.log, appended to by every
            # rep, so this rep's worker is ready at one " ready." more than the file had before
            "worker_ready_s": lambda: _count_in(worker_log, " ready.") > readies_before})
        children = harness.tree(proc.pid)
    finally:
        children = children or harness.tree(proc.pid)
        session.stop(name, grace=30)  # serve stops its children on SIGTERM
        # its children run in sessions of their own, so session.stop's group sweep misses them
        for pid in set(children) & set(harness.marked_processes(session.id)):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    return seen


# --- the scenario --------------------------------------------------------------------------------

def _stats(values: list[float]) -> tuple[float, float]:
    return statistics.median(values), max(values)


def run(session: harness.Session, args) -> dict:
    reps = getattr(args, "reps", None) or 5
    paused = pause_workers(session)
    serve_dir = session.data_dir / "serve"
    kinds = {
        "web": lambda i: web_once(session, f"startweb{i}"),
        "worker": lambda i: worker_once(session, f"startworker{i}", args.concurrency),
        "serve": lambda i: serve_once(session, f"startserve{i}", serve_dir),
    }
    samples: dict[str, list[dict]] = {}
    throwaway: dict[str, dict] = {}
    try:
        for kind, once in kinds.items():
            throwaway[kind] = once("w")  # page cache (and, for serve, its SQLite migrated)
            samples[kind] = [once(i) for i in range(reps)]
            print(f"  {kind}: throwaway {throwaway[kind]}; then "
                  f"{[round(max(s.values()), 2) for s in samples[kind]]}", flush=True)
    finally:
        resume_workers(session, paused, args.concurrency)
    lines = [
        ("web (gunicorn 2 x 4 threads)", "spawn -> first 200 /healthz", "web", "http_200_s"),
        (f"worker (celery, {args.concurrency} children)", "spawn -> ' ready.' logged", "worker", "ready_log_s"),
        ("", "spawn -> sweep sent at spawn done", "worker", "task_done_s"),
        ("", "ready to work (the later)", "worker", "ready_to_work_s"),
        ("muster serve (SQLite, fs broker)", "spawn -> migrate + bootstrap done", "serve", "banner_s"),
        ("", "spawn -> first 200 /healthz", "serve", "http_200_s"),
        ("", "spawn -> its worker ' ready.'", "serve", "worker_ready_s"),
    ]
    rows, figures = [], {}
    for label, what, kind, key in lines:
        med, top = _stats([s[key] for s in samples[kind]])
        figures[f"{kind}.{key}"] = {"median_s": med, "max_s": top, "throwaway_s": throwaway[kind][key]}
        rows.append([label, what, reps, throwaway[kind][key], med, top,
                     "yes" if top <= TARGET else ("median only" if med <= TARGET else "no")])
    text = table(f"start: warm start, seconds from spawn (target: ready to work <= {TARGET:.0f} s)",
                 ["process", "until", "reps", "throwaway s", "median s", "max s", f"<= {TARGET:.0f} s"], rows)
    return {"reps": reps, "figures": figures, "samples": samples, "throwaway": throwaway, "table": text}
