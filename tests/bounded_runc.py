"""An OCI runtime for the test hosts' dockerds on machines whose capability bounding set is short.

`docker run --privileged` asks runc for every capability up to /proc/sys/kernel/cap_last_cap.
Some sandboxes and VMs run everything, root included, with a bounding set that lacks a few (one
CI machine lacks CAP_SYS_RESOURCE: CapBnd 000001fffeffffff with cap_last_cap 40), and runc then
fails with "unable to apply caps". The product keeps passing `--privileged`, as dstack does on TPU
VMs; only the test hosts' daemons use this wrapper (tests/sshhosts.py registers it with
`--add-runtime` and `--default-runtime`, and only where capabilities are missing). For
`create`, `run` and `exec`, it removes from the OCI bundle's process capability sets the
capabilities this machine's bounding set does not hold, nothing else, then execs the real runc
with the same arguments. A privileged container keeps everything the machine can give it
(HostConfig.Privileged stays true, devices and mounts are untouched).

Run as a script: `python bounded_runc.py [runc arguments]`.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

# linux/capability.h, by number
CAPABILITIES = [
    "CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "SETPCAP",
    "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN", "NET_RAW", "IPC_LOCK", "IPC_OWNER",
    "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT", "SYS_ADMIN", "SYS_BOOT", "SYS_NICE",
    "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD", "LEASE", "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP",
    "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG", "WAKE_ALARM", "BLOCK_SUSPEND", "AUDIT_READ", "PERFMON", "BPF",
    "CHECKPOINT_RESTORE",
]


def bounding_set() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapBnd:"):
            return int(line.split()[1], 16)
    return -1  # unknown: take nothing away


def last_capability() -> int:
    try:
        return int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    except (OSError, ValueError):
        return len(CAPABILITIES) - 1


def missing() -> list[str]:
    """CAP_ names up to cap_last_cap that the bounding set lacks ([] on an ordinary machine)."""
    bounding = bounding_set()
    if bounding < 0:
        return []
    return [f"CAP_{CAPABILITIES[n]}" if n < len(CAPABILITIES) else f"capability {n}"
            for n in range(last_capability() + 1) if not bounding >> n & 1]


def install(directory: Path) -> Path:
    """A launcher of this wrapper in `directory`, for dockerd's --add-runtime."""
    launcher = directory / "bounded-runc"
    launcher.write_text(f"#!/bin/sh\nexec {sys.executable} {Path(__file__).resolve()} \"$@\"\n")
    launcher.chmod(0o755)
    return launcher


def _option(args: list[str], long: str, short: str) -> str | None:
    for i, arg in enumerate(args):
        if arg in (long, short) and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(long + "="):
            return arg.split("=", 1)[1]
    return None


def _subcommand(args: list[str]) -> tuple[str, list[str]]:
    for i, arg in enumerate(args):
        if arg in ("create", "run", "exec"):
            return arg, args[i + 1:]
    return "", []


def _trim(process: dict, lacking: set[str]) -> None:
    caps = process.get("capabilities")
    if isinstance(caps, dict):
        for name, values in caps.items():
            if isinstance(values, list):
                caps[name] = [v for v in values if v not in lacking]


def trim_file(path: Path, lacking: set[str], whole_bundle: bool) -> None:
    data = json.loads(path.read_text())
    _trim(data.get("process", {}) if whole_bundle else data, lacking)
    path.write_text(json.dumps(data))


def main(args: list[str]) -> None:
    runc = shutil.which("runc") or "/usr/sbin/runc"
    lacking = set(missing())
    command, rest = _subcommand(args)
    if lacking and command in ("create", "run"):
        bundle = _option(rest, "--bundle", "-b") or "."
        trim_file(Path(bundle) / "config.json", lacking, whole_bundle=True)
    elif lacking and command == "exec":
        process = _option(rest, "--process", "-p")
        if process:
            trim_file(Path(process), lacking, whole_bundle=False)
    os.execv(runc, [runc, *args])


if __name__ == "__main__":
    main(sys.argv[1:])
