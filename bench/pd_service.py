"""A PD service in a bench session (bench/chaos_pd.py, bench/pd_recovery.py): the real `smg` router in
front of stand-in SGLang workers (serving/standin.py), the endpoint process, a client that streams
requests through it, and what smg lists beside what it should list.

Every replica writes `<pid> <group> <address>` to `<piddir>/pids` (all it ever started, for the
orphan check) and its pid to `<piddir>/<address>.pid` (the one running there now, for the kills),
then becomes its server (exec), so the pid is the server's. A stand-in's `served_by` names its
address and pid: an answer says which worker process made it.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from bench import harness

STANDIN = harness.ROOT / "serving" / "standin.py"


def smg_binary() -> str:
    found = shutil.which("smg") or str(Path(sys.executable).parent / "smg")
    if not Path(found).exists():
        raise SystemExit("smg is not installed (pip install smg: Muster's dev extra has it)")
    return found


def pd_yaml(name: str, port: int, piddir: Path, *, decode: int = 2, version: str = "v1", any_address: bool = False,
            fleet: str | None = None, max_surge: int | None = None) -> str:
    """router (smg, round robin: its default policy keeps a prompt prefix on one worker, so a worker
    replaced could go without requests) + 1 prefill + `decode` decodes, retried on errors. `version` is an env value: a new
    one is a new revision (an update). `any_address`: servers listen on 0.0.0.0 (an SSH host in a
    namespace, whose probes knock on its 127.0.0.1); else on the replica's own loopback address."""
    host = "0.0.0.0" if any_address else "$DSTACK_NODE_IP"
    probe = "    probes:\n      - type: http\n        url: /health\n        interval: 1s\n        timeout: 1s\n"

    def pid(group: str) -> str:
        return (f"      - echo $$ {group} $DSTACK_NODE_IP >> {piddir}/pids && echo $$ > {piddir}/$DSTACK_NODE_IP.pid\n")

    def standin(role: str, extra: str = "") -> str:
        return (f"      - exec {sys.executable} {STANDIN} --host {host} --port {port} --role {role} "
                f"--name {role}@$DSTACK_NODE_IP#$$ {extra}\n")

    return (f"type: service\nname: {name}\nport: {port}\nenv:\n  - VERSION={version}\n"
            "retry:\n  on_events: [error]\n  duration: 1h\n"
            + (f"fleets: [{fleet}]\n" if fleet else "")
            + (f"rollout:\n  max_surge: {max_surge}\n" if max_surge else "")
            + "groups:\n"
            "  - name: router\n    replicas: 1\n    router:\n      type: smg\n    commands:\n" + pid("router")
            + f"      - exec {smg_binary()} launch --host {host} --port {port} --pd-disaggregation "
              f"--prometheus-host {host} --prometheus-port {port + 1} --policy round_robin --log-level warn\n" + probe
            + "  - name: prefill\n    replicas: 1\n    commands:\n" + pid("prefill")
            + standin("prefill", f"--bootstrap-port {port + 2}") + probe
            + f"  - name: decode\n    replicas: {decode}\n    commands:\n" + pid("decode") + standin("decode") + probe)


def free_port_block(n: int = 3) -> int:
    """A port p with p .. p+n-1 free on 127.0.0.1 (service, smg's metrics, the prefill's bootstrap)."""
    while True:
        base = harness.free_port()
        try:
            for k in range(n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", base + k))
            return base
        except OSError:
            continue


# --- the service's rows ---------------------------------------------------------------------------

def heads(run_id: int) -> list:
    """The run's ready replica heads (node 0), with their instances."""
    from runs.models import Run
    from serving.replicas import is_head, is_ready

    run = Run.objects.get(pk=run_id)
    return [j for j in run.current_jobs().select_related("instance") if is_ready(j) and is_head(j)]


def expected(router, ready: list, port: int) -> set[tuple[str, str]]:
    """What router job `router` should list: the ready heads of the other groups of its deployment,
    not draining (PD.md's rule), as (url, role)."""
    return {(f"http://{j.instance.internal_ip}:{port}", j.node_group_name) for j in ready
            if j.node_group_name != "router" and j.deployment_num == router.deployment_num and j.drain_at is None}


def smg_workers(host: str, port: int, timeout: float = 5) -> set[tuple[str, str]] | None:
    """(url, worker_type) smg at host:port lists and is not draining; None when it does not answer."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/workers", timeout=timeout) as answer:
            found = json.loads(answer.read(1 << 20))["workers"]
    except (OSError, ValueError, KeyError):
        return None
    return {(w["url"], w["worker_type"]) for w in found if w.get("status") != "draining"}


def stale(run_id: int, port: int) -> tuple[int, list[str]]:
    """Entries by which each ready router's list differs from what it should list (both ways)."""
    ready = heads(run_id)
    count, said = 0, []
    for router in [j for j in ready if j.node_group_name == "router"]:
        got = smg_workers(router.instance.internal_ip, port)
        want = expected(router, ready, port)
        if got is None:
            count, said = count + 1, [*said, f"router {router.instance.internal_ip} does not answer /workers"]
            continue
        extra, missing = got - want, want - got
        count += len(extra) + len(missing)
        said += [f"router {router.instance.internal_ip} lists {u} ({r}), not ready or not its deployment"
                 for u, r in sorted(extra)]
        said += [f"router {router.instance.internal_ip} lacks ready {u} ({r})" for u, r in sorted(missing)]
    return count, said


def alive(pid: int) -> bool:
    """A live server process of ours (not a zombie, not a reused pid of something else)."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z" and (b"standin" in cmd or b"smg" in cmd)


def started(piddir: Path) -> list[tuple[int, str, str]]:
    """(pid, group, address) of every replica process the service ever started."""
    path = piddir / "pids"
    rows = [line.split() for line in path.read_text().splitlines()] if path.exists() else []
    return [(int(r[0]), r[1], r[2]) for r in rows if len(r) == 3]


def strays(session: harness.Session) -> list[int]:
    """Processes working under the session's data dir that are not the session's own: local runner
    jobs and what they started (their environment is the job's, without the BENCH_SESSION mark)."""
    # the session's own by their mark, or as the trees of the processes it started (a process that
    # sets its title, as celery beat does, overwrites its environment where /proc shows it)
    mine = set(harness.marked_processes(session.id))
    for proc in list(session.procs.values()):
        mine.update(harness.tree(proc.pid))
    mark = str(session.data_dir).encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in mine or int(entry) == os.getpid():
            continue
        try:
            raw = Path(f"/proc/{entry}/cmdline").read_bytes() + Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if mark in raw:
            found.append(int(entry))
    return found


def supervise(session: harness.Session, names: list[str], restarts: list[str], stop: threading.Event,
              start, lock: threading.Lock | None = None) -> threading.Thread:
    """Start again a session process that exited on its own, as `muster serve` or systemd does for
    the product's worker (a Celery worker may exit on a broker restart: kombu's "Unrecoverable
    error"); each restart is noted in `restarts`."""

    guard = lock or threading.Lock()  # the caller's lock: its own kills restart what they kill

    def loop():
        while not stop.wait(0.5):
            with guard:
                for name in names:
                    proc = session.procs.get(name)
                    if proc is not None and proc.poll() is not None:
                        session.procs.pop(name)
                        proc._bench_log.close()  # type: ignore[attr-defined]
                        start(name)
                        restarts.append(f"{time.strftime('%H:%M:%S')} {name} exited ({proc.returncode}); "
                                        "started again")

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


def pid_at(piddir: Path, address: str) -> int | None:
    try:
        return int((piddir / f"{address}.pid").read_text())
    except (OSError, ValueError):
        return None


# --- the endpoint and a client ------------------------------------------------------------------

def start_endpoint(session: harness.Session) -> str:
    """`serve_endpoint` as a process of the session; its base URL."""
    port = harness.free_port()
    session.start("endpoint", [sys.executable, "-m", "django", "serve_endpoint", "--bind", f"127.0.0.1:{port}"],
                  env={"MUSTER_ENDPOINT_ROUTES_REFRESH": "60", "PYTHONUNBUFFERED": "1",
                       # the product's settings: the endpoint needs none of the bench's (and bench.settings
                       # imported first by `django` would import the Celery app before Django's settings)
                       "DJANGO_SETTINGS_MODULE": "muster.settings"})
    if not harness.wait_until(lambda: _listens("127.0.0.1", port), 60, every=0.1):
        raise RuntimeError("the endpoint did not listen: " + (session.data_dir / "endpoint.log").read_text()[-2000:])
    return f"http://127.0.0.1:{port}"


def _listens(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), 0.5).close()
        return True
    except OSError:
        return False


@dataclass
class Answer:
    at: float          # time.time() the request was sent
    took: float        # seconds until the answer (or the client's bound)
    status: int | str  # HTTP status, "timeout" (no answer within the bound) or "error: ..." (no HTTP answer)
    served_by: str = ""  # the decode stand-in that answered (`decode@<address>#<pid>`)


@dataclass
class Load:
    """`clients` threads POSTing /generate through the endpoint back to back (`pause` between),
    each request bounded by `bound` seconds."""
    url: str
    token: str
    clients: int = 4
    bound: float = 30.0
    pause: float = 0.02
    backoff: float = 0.5  # after an answer other than 200, as a client that retries a 5xx waits
    answers: list[Answer] = field(default_factory=list)

    def __post_init__(self):
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._loop, args=(k,), daemon=True) for k in range(self.clients)]

    def start(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(self.bound + 5)

    def _loop(self, k: int) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            ok = self._one(json.dumps({"text": f"client {k} request {n}"}).encode())
            self.stop.wait(self.pause if ok else self.backoff)

    def _one(self, body: bytes) -> bool:
        request = urllib.request.Request(self.url + "generate", data=body, headers={
            "Content-Type": "application/json", "Authorization": f"Bearer {self.token}"})
        t0, served = time.time(), ""
        try:
            with urllib.request.urlopen(request, timeout=self.bound) as answer:
                status, raw = answer.status, answer.read(1 << 20)
            served = json.loads(raw).get("meta_info", {}).get("served_by", "")
        except urllib.error.HTTPError as exc:
            status = exc.code
        except TimeoutError:
            status = "timeout"
        except (OSError, ValueError) as exc:
            status = "timeout" if "timed out" in str(exc) else f"error: {exc}"
        with self.lock:
            self.answers.append(Answer(t0, time.time() - t0, status, served))
        return status == 200

    def tally(self, since: float = 0.0) -> dict[str, int]:
        with self.lock:
            got = [a for a in self.answers if a.at >= since]
        ok = sum(a.status == 200 for a in got)
        retry = sum(isinstance(a.status, int) and 500 <= a.status < 600 for a in got)
        hung = sum(a.status == "timeout" for a in got)
        return {"requests": len(got), "ok": ok, "5xx (retryable)": retry, "hung past the bound": hung,
                "other (4xx, no HTTP answer)": len(got) - ok - retry - hung}


def session_env() -> dict[str, str]:
    """Process environment for a session whose local jobs run smg and the stand-ins: the venv first
    on PATH (local jobs get the server's environment)."""
    venv_bin = str(Path(sys.executable).parent)
    return {"PATH": venv_bin + os.pathsep + os.environ.get("PATH", "")}
