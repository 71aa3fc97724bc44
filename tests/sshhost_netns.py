"""The 10.x subnets of netns-mode test hosts: a free one per pool, and what dead test runs left."""

from __future__ import annotations

import ipaddress
import os
import re
import signal

from tests.sshhost_tools import _pid_alive, _run

_NAME_RE = re.compile(r"^mu([0-9a-f]+)s\d+")


def _used_networks() -> list[ipaddress.IPv4Network]:
    out = _run(["ip", "-4", "-o", "addr", "show"], check=False).stdout
    nets = []
    for match in re.finditer(r"inet (\S+)", out):
        nets.append(ipaddress.IPv4Interface(match.group(1)).network)
    routes = _run(["ip", "-4", "route", "show"], check=False).stdout
    for line in routes.splitlines():
        first = line.split()[0] if line.split() else ""
        if "/" in first:
            nets.append(ipaddress.IPv4Network(first, strict=False))
    return nets


def _free_subnet(number: int) -> ipaddress.IPv4Network:
    # Derived from the pid so concurrent test runs start from different subnets, then checked
    # against what this machine already routes.
    used = _used_networks()
    start = (os.getpid() * 7 + number * 131) % (150 * 256)
    for i in range(150 * 256):
        n = (start + i) % (150 * 256)
        candidate = ipaddress.IPv4Network(f"10.{100 + n // 256}.{n % 256}.0/24")
        if not any(candidate.overlaps(u) for u in used):
            return candidate
    raise RuntimeError("no free 10.x /24 subnet")


def _remove_stale_networks() -> None:
    """Delete namespaces and bridges left by test runs whose process died without tearing down."""
    names = _run(["ip", "netns", "list"], check=False).stdout.split("\n")
    for line in names:
        ns = line.split(" ")[0]
        match = _NAME_RE.match(ns)
        if match and not _pid_alive(int(match.group(1), 16)):
            for pid in _run(["ip", "netns", "pids", ns], check=False).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            _run(["ip", "netns", "del", ns], check=False)
    links = _run(["ip", "-o", "link", "show", "type", "bridge"], check=False).stdout
    for match in re.finditer(r"^\d+: (mu([0-9a-f]+)s\d+br)[:@]", links, re.MULTILINE):
        if not _pid_alive(int(match.group(2), 16)):
            _run(["ip", "link", "del", match.group(1)], check=False)
