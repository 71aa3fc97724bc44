"""Processes that leave a job's process group, as real jobs start them (run by the job's shell).

usage: escapes.py TOKEN TIMEOUT_PORT DAEMON_PORT

Starts, and returns once all of them are up:
- GNU ``timeout 600 python3 -m http.server TIMEOUT_PORT`` (timeout moves itself and its child into
  a process group of their own);
- ``setsid`` python sleeping 600 s (a session of its own), TOKEN-setsid in its command line;
- a double-forking daemon listening on DAEMON_PORT, TOKEN-daemon in its command line.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

DAEMON = (
    "import socket, sys, time\n"
    "s = socket.socket()\n"
    "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind(('127.0.0.1', int(sys.argv[2])))\n"
    "s.listen()\n"
    "time.sleep(600)\n"
)


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def main() -> None:
    token, timeout_port, daemon_port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    py = sys.executable
    quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    subprocess.Popen(["timeout", "600", py, "-m", "http.server", str(timeout_port), "--bind", "127.0.0.1"], **quiet)
    subprocess.Popen(["setsid", py, "-c", "import time; time.sleep(600)", f"{token}-setsid"], **quiet)
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            os.execv(py, [py, "-c", DAEMON, f"{token}-daemon", str(daemon_port)])
        os._exit(0)
    os.wait()
    deadline = time.monotonic() + 30
    while not (listening(timeout_port) and listening(daemon_port)):
        if time.monotonic() > deadline:
            sys.exit("escapes did not come up")
        time.sleep(0.1)
    print("escapes up", flush=True)


if __name__ == "__main__":
    main()
