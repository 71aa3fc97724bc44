"""What `make run` (`muster serve`) and `make demo` print and leave behind (issue 20, item 10),
each started as the real process a developer starts."""

from __future__ import annotations

import ipaddress
import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from bench.soak import ROOT, ServeProcess, free_port
from tests.local_processes import as_from_a_terminal
from tests.waiting import patient, wait_until

pytestmark = pytest.mark.slow


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


def _get(url: str, token: str, path: str):
    request = urllib.request.Request(f"{url}/api/projects/main/{path}", headers={"Authorization": f"Token {token}"})
    with urllib.request.urlopen(request, timeout=30) as r:
        return json.loads(r.read())


def _processes_naming(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and text.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def test_the_banner_shows_the_console_the_password_file_and_a_token_command_that_works(tmp_path):
    data = tmp_path / "data"
    serve = ServeProcess(data, concurrency=1).start()
    try:
        out = serve.log()
        assert f"Muster: console {serve.url}/  API {serve.url}/api/" in out
        password = (data / "admin_password").read_text().strip()
        assert f"admin user: admin / {password}  (kept in {data / 'admin_password'})" in out
        command = re.search(r"^another token: (.+)$", out, re.M).group(1)
        assert "manage.py muster_token admin" in command and f"MUSTER_DATA_DIR={data}" in command

        # pasted as printed, from where `make run` runs
        made = subprocess.run(command, shell=True, cwd=ROOT, env=serve.env, capture_output=True, text=True,
                              timeout=120)
        assert made.returncode == 0, made.stderr
        token = made.stdout.strip().splitlines()[-1].split()[-1]
        assert token != serve.token
        assert _get(serve.url, token, "runs/") == []
    finally:
        serve.stop()


def test_make_run_serves_on_the_bind_it_is_given(tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL")}
    # a port of its own for the dstack SSH gateway: another suite's `make run` may hold the default
    env.update(MUSTER_DATA_DIR=str(tmp_path / "data"), PYTHONUNBUFFERED="1", MUSTER_DSTACK_SSH_BIND=f"127.0.0.1:{free_port()}",
               MUSTER_ENDPOINT_BIND=f"127.0.0.1:{free_port()}")
    log = tmp_path / "make.log"
    with log.open("wb") as out:
        make = subprocess.Popen(["make", "run", f"BIND=127.0.0.1:{port}"], cwd=ROOT, env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=as_from_a_terminal)
    try:
        wait_until(lambda: _answers(f"http://127.0.0.1:{port}") or make.poll() is not None, timeout=180,
                   what="make run answering on its BIND")
        assert make.poll() is None, log.read_text()
        assert f"console http://127.0.0.1:{port}/" in log.read_text()
    finally:
        os.killpg(make.pid, signal.SIGTERM)
        make.wait(patient(60))


def test_the_demo_stays_up_with_real_credentials_on_its_own_addresses_and_cleans_up(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "MUSTER_DEMO_BIND": f"127.0.0.1:{port}", "TMPDIR": str(tmp_path), "PYTHONUNBUFFERED": "1",
           "MUSTER_DSTACK_SSH_BIND": f"127.0.0.1:{free_port()}", "MUSTER_ENDPOINT_BIND": f"127.0.0.1:{free_port()}"}
    env.pop("MUSTER_DATA_DIR", None)
    log = tmp_path / "demo.log"
    with log.open("wb") as out:
        demo = subprocess.Popen([sys.executable, "-m", "muster.demo"], cwd=ROOT, env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_until(lambda: "Ctrl-C stops it" in log.read_text() or demo.poll() is not None, timeout=300,
                   what="the demo's run ended and its banner")
        out = log.read_text()
        assert demo.poll() is None, out
        data = Path(re.search(r"data in (\S+)\)", out).group(1))
        password = (data / "admin_password").read_text().strip()
        assert f"console  {url}/   user admin, password {password}" in out
        assert "(set earlier)" not in out
        token = re.search(r"MUSTER_TOKEN=(\S+)", out).group(1)
        run = _get(url, token, "runs/pd-local/")  # still serving: the run can be looked at
        assert run["status"] == "done", run
        # its own loopback addresses from MUSTER_LOCAL_FIRST_ADDRESS on (127.0.0.6 unless set, apart
        # from make run's 127.0.0.2-5; the tests give each run a block of its own, tests/conftest.py)
        first = ipaddress.ip_address(os.environ["MUSTER_LOCAL_FIRST_ADDRESS"])
        assert sorted(j["instance_ip"] for j in run["jobs"]) == [str(first + i) for i in range(3)]
        # then the PD service: a request through the endpoint went router (smg) -> prefill -> decode
        assert re.search(r"router \(smg\) -> prefill prefill@\S+ \(room \d+\) -> decode decode@\S+: answered", out), out

        demo.send_signal(signal.SIGTERM)  # as a supervisor stops it; Ctrl-C is the same path (finally)
        assert demo.wait(patient(90)) == 0, log.read_text()
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
    assert not data.exists(), "the demo removed its data directory"
    assert f"removed {data}" in log.read_text()
    assert not _answers(url), "the demo's server is gone"
    wait_until(lambda: not _processes_naming(str(data)), timeout=30, what="the demo's runner agents gone")
    assert not list(tmp_path.glob("muster-demo-*"))
