"""`muster serve`'s dstack SSH gateway follows `--bind`'s host, takes its port from `--gateway-port`
(or MUSTER_DSTACK_SSH_PORT), and a port someone else holds is one clear line on the quiet terminal,
not a traceback per restart. A real `muster serve` on the embedded default, OpenSSH's ssh-keyscan."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from bench.soak import ROOT, free_port
from dstack_api.gateway.server import BIND_RETRY
from tests.waiting import wait_until

pytestmark = pytest.mark.slow
HOST = "127.0.0.2"  # not the gateway's old fixed 127.0.0.1


def _keyscan(host: str, port: int) -> str:
    done = subprocess.run(["ssh-keyscan", "-T", "5", "-t", "ed25519", "-p", str(port), host],
                          capture_output=True, text=True, timeout=60)
    return next((ln for ln in done.stdout.splitlines() if ln.startswith(f"[{host}]:{port} ssh-ed25519 ")), "")


def test_the_gateway_listens_on_the_bind_host_and_a_taken_port_is_said_once(tmp_path):
    web, gw = free_port(), free_port()
    taken = socket.create_server((HOST, gw))  # someone else holds the gateway's port
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "CELERY_BROKER_URL") and not k.startswith("MUSTER_DSTACK_SSH")}
    env.update({"MUSTER_DATA_DIR": str(tmp_path / "data"), "DJANGO_SETTINGS_MODULE": "muster.settings",
                "PYTHONUNBUFFERED": "1", "MUSTER_ENDPOINT_BIND": f"{HOST}:{free_port()}"})
    log_path = tmp_path / "serve.log"
    with log_path.open("ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "cli", "serve", "--bind", f"{HOST}:{web}", "--concurrency", "1",
                                 "--gateway-port", str(gw)], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)

    def said(text: str) -> bool:
        assert proc.poll() is None, log_path.read_text()
        return text in log_path.read_text()

    try:
        wait_until(lambda: said(f"cannot listen on {HOST}:{gw}"), timeout=120, what="the gateway's line")
        time.sleep(3 * BIND_RETRY)  # tries again meanwhile, quietly
        out = log_path.read_text()
        assert out.count("cannot listen on") == 1, out
        assert "Traceback" not in out and "--gateway-port" in out, out
        taken.close()
        line = wait_until(lambda: _keyscan(HOST, gw), timeout=60, what="the gateway on the freed port")
        assert line and not _keyscan("127.0.0.1", gw), "on --bind's host only"
        assert "restarting" not in log_path.read_text()
    finally:
        taken.close()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
