"""``forward``: the forced command of an attach key (runs/services/attach.py).

It carries one TCP connection between the SSH session's stdin/stdout and ``ip:PORT``, PORT being
the command the client asked to run and one of the job's ports. The key has no port forwarding at
all: sshd's ``permitlisten`` cannot hold a Unix-socket ``-R`` (OpenSSH 9.2 lets any path through a
non-empty list), so the bytes go through the session itself instead of a forwarded channel.
"""

from __future__ import annotations

import os
import select
import socket
import sys

FORWARD_BUFFER = 64 << 10


def granted(keys: str, grant: str) -> bool:
    try:
        with open(os.path.expanduser(keys), encoding="utf-8", errors="replace") as f:
            return any(line.rstrip("\n").endswith(" " + grant) for line in f)
    except OSError:
        return False


def cmd_forward(ip: str, ports: str, keys: str = "", grant: str = "") -> int:
    wanted = os.environ.get("SSH_ORIGINAL_COMMAND", "").strip()
    allowed = [p for p in ports.split(",") if p.isdigit()]
    if keys and grant and not granted(keys, grant):
        # the line is gone (revoked) but this SSH connection was made before: no new session
        sys.stderr.write("muster attach: this key was revoked\n")
        return 2
    if wanted not in allowed:
        sys.stderr.write(f"muster attach: this key reaches port {','.join(allowed)} of {ip} only\n")
        return 2
    try:
        conn = socket.create_connection((ip, int(wanted)), timeout=10)
    except OSError as e:
        sys.stderr.write(f"muster attach: cannot connect to {ip}:{wanted}: {e}\n")
        return 1
    conn.settimeout(None)
    stdin, stdout = sys.stdin.fileno(), sys.stdout.fileno()
    reading = [stdin, conn]
    while reading:
        for ready in select.select(reading, [], [])[0]:
            if ready is conn:
                data = conn.recv(FORWARD_BUFFER)
                if not data:
                    return 0
                while data:
                    data = data[os.write(stdout, data):]
            else:
                data = os.read(stdin, FORWARD_BUFFER)
                if not data:  # the client is done sending: the job may still answer
                    conn.shutdown(socket.SHUT_WR)
                    reading.remove(stdin)
                else:
                    conn.sendall(data)
    return 0
