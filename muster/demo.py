"""`make demo`: start Muster on a scratch data directory, apply the local PD example, show it end,
then the local PD service: a request through the endpoint going router -> prefill -> decode; then
keep serving so the runs can be looked at, until Ctrl-C.

The router, prefill and decode groups run on the local backend; the task's router starts last and
prints what it fetched from both workers. The service's router is the real `smg` in front of
stand-in SGLang workers (examples/pd-disagg-local-service.yml), applied with both named by path
(this virtualenv's `smg`, this checkout's serving/standin.py): a local job has the server's PATH,
whose `python3` need not import this checkout. The demo's local fleet takes 127.0.0.6 upwards
(MUSTER_LOCAL_FIRST_ADDRESS), so it runs beside `make run`'s (127.0.0.2-5) on one machine, and its
server listens on MUSTER_DEMO_BIND (127.0.0.1:8765). Ctrl-C (or SIGTERM) stops the server and
removes the data directory. Exits with the CLI's status for the run: 0 when it ended done.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from runs.choices import RUN_FINISHED

ROOT = Path(__file__).resolve().parent.parent
BIND = os.environ.get("MUSTER_DEMO_BIND", "127.0.0.1:8765")
DSTACK_SSH_BIND = "127.0.0.1:2223"
ENDPOINT_BIND = "127.0.0.1:8766"
FIRST_ADDRESS = "127.0.0.6"


def _say(text: str) -> None:
    print(f"demo: {text}", flush=True)


def _wait_until_up(url: str, server: subprocess.Popen, log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            break
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=2):
                return
        except OSError:
            time.sleep(0.3)
    tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
    raise SystemExit(f"demo: Muster did not come up at {url}:\n{tail}")


def _bootstrap(manage: list[str], env: dict) -> tuple[str, str]:
    """Migrate and bootstrap (project main, admin and its password, the local fleet, a token) before
    the server starts, so the demo has the password and the token the bootstrap prints once."""
    subprocess.run([*manage, "migrate", "--noinput", "-v", "0"], env=env, check=True, cwd=ROOT, timeout=300)
    out = subprocess.run([*manage, "muster_bootstrap"], env=env, check=True, cwd=ROOT, capture_output=True,
                         text=True, timeout=120).stdout
    password = re.search(r"^admin user: admin / (\S+)", out, re.M)
    token = re.search(r"^token: (\S+)$", out, re.M)
    if not password or not token:
        raise SystemExit(f"demo: the bootstrap printed no password or token:\n{out}")
    return password.group(1), token.group(1)


def _stop(server: subprocess.Popen) -> None:
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(10)


def _remove(data: str) -> None:
    # the local runner agents leave once serve has asked them to (agent.stop), within a poll or two;
    # one still writing its status file makes a single rmtree fail
    deadline = time.monotonic() + 15
    while os.path.exists(data):
        shutil.rmtree(data, ignore_errors=time.monotonic() < deadline)
        time.sleep(0.2)


def _wait_for_stop(server: subprocess.Popen) -> None:
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    while not stop and server.poll() is None:
        time.sleep(0.5)
    if server.poll() is not None:
        _say(f"the server exited with status {server.returncode}")


def _show_pd_service(cli: list[str], client_env: dict, token: str, endpoint: str, data: str,
                     timeout: float = 120) -> int:
    """Apply the local PD service and send it one request through the endpoint once it answers."""
    _say("applying examples/pd-disagg-local-service.yml (smg in front of stand-in prefill and decode workers)")
    conf = Path(data) / "pd-disagg-local-service.yml"
    conf.write_text((ROOT / "examples" / "pd-disagg-local-service.yml").read_text()
                    .replace("python3 -m serving.standin", f"{sys.executable} {ROOT / 'serving' / 'standin.py'}")
                    .replace("exec smg ", f"exec {Path(sys.executable).parent / 'smg'} "))
    code = subprocess.run([*cli, "apply", "-f", str(conf), "-y"], env=client_env, cwd=ROOT).returncode
    if code:
        return code
    url = f"http://{endpoint}/proxy/services/main/pd-local-service/generate"
    request = urllib.request.Request(url, data=json.dumps({"text": "hello from the demo"}).encode(), headers={
        "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    deadline, last = time.monotonic() + timeout, ""
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                meta = json.loads(answer.read())["meta_info"]
            if meta.get("prefill"):
                _say(f"POST {url}\n  router (smg) -> prefill {meta['prefill'].get('prefill')} (room "
                     f"{meta['prefill'].get('room')}) -> decode {meta.get('served_by')}: answered")
                return 0
            last = f"no prefill in the answer: {meta}"
        except (OSError, ValueError, KeyError) as exc:  # not ready yet: 503 while no worker is listed
            last = str(exc)
        time.sleep(1)
    _say(f"the PD service did not answer through router -> prefill -> decode within {timeout:.0f}s: {last}")
    return 1


def _stop_service(url: str, token: str, timeout: float = 60) -> None:
    """Stop the PD service and wait for it to end: its local jobs outlive the server otherwise."""
    headers = {"Authorization": f"Token {token}", "Content-Type": "application/json"}
    run = f"{url}/api/projects/main/runs/pd-local-service/"
    try:
        urllib.request.urlopen(urllib.request.Request(run + "stop", data=b"{}", headers=headers), timeout=10).close()
    except OSError as exc:
        _say(f"the PD service was not stopped: {exc}")  # a 404: never applied
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(urllib.request.Request(run, headers=headers), timeout=10) as answer:
                if json.loads(answer.read()).get("status") in RUN_FINISHED:
                    return
        except (OSError, ValueError):
            return
        time.sleep(0.5)
    _say(f"the PD service had not stopped after {timeout:.0f}s")


def main() -> int:
    data = tempfile.mkdtemp(prefix="muster-demo-")
    env = {**os.environ, "MUSTER_DATA_DIR": data, "DJANGO_SETTINGS_MODULE": "muster.settings",
           "MUSTER_LOCAL_FIRST_ADDRESS": os.environ.get("MUSTER_LOCAL_FIRST_ADDRESS", FIRST_ADDRESS),
           # its own dstack SSH gateway and services endpoint ports too, so it runs beside `make run`
           # (which has 2222 and 8001)
           "MUSTER_DSTACK_SSH_BIND": os.environ.get("MUSTER_DSTACK_SSH_BIND", DSTACK_SSH_BIND),
           "MUSTER_ENDPOINT_BIND": os.environ.get("MUSTER_ENDPOINT_BIND", ENDPOINT_BIND)}
    env.pop("DATABASE_URL", None)
    env.pop("CELERY_BROKER_URL", None)
    manage = [sys.executable, str(ROOT / "manage.py")]
    url = f"http://{BIND}"
    server = None
    token = ""
    code = 130
    try:
        password, token = _bootstrap(manage, env)
        log = Path(data) / "serve.log"
        with log.open("ab") as out:
            server = subprocess.Popen([sys.executable, "-m", "cli", "serve", "--bind", BIND], env=env, cwd=ROOT,
                                      start_new_session=True, stdin=subprocess.DEVNULL, stdout=out,
                                      stderr=subprocess.STDOUT)
        _wait_until_up(url, server, log)
        _say(f"Muster is up at {url} (data in {data}); applying examples/pd-disagg-local.yml")
        client_env = {**env, "MUSTER_URL": url, "MUSTER_TOKEN": token, "MUSTER_PROJECT": "main"}
        cli = [sys.executable, "-m", "cli"]
        code = subprocess.run([*cli, "apply", "-f", str(ROOT / "examples" / "pd-disagg-local.yml"), "-y"],
                              env=client_env, cwd=ROOT).returncode
        if code == 0:
            code = _show_pd_service(cli, client_env, token, env["MUSTER_ENDPOINT_BIND"], data)
        subprocess.run([*cli, "ps", "-a"], env=client_env, cwd=ROOT, timeout=60)
        print(flush=True)
        _say("Muster keeps serving so you can look at the run:")
        print(f"  console  {url}/   user admin, password {password}\n"
              f"  CLI      MUSTER_URL={url} MUSTER_TOKEN={token} {ROOT / '.venv' / 'bin' / 'muster'} ps -v\n"
              f"  server   its log is {log}\n"
              f"Ctrl-C stops it and removes {data}.", flush=True)
        _wait_for_stop(server)
    except KeyboardInterrupt:
        print(flush=True)
    finally:
        if server is not None:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not leave the directory behind
            if token and server.poll() is None:
                _stop_service(url, token)
            _stop(server)
        _remove(data)
        _say(f"stopped; removed {data}")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
