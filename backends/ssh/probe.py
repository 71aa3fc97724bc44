"""Probe a host's resources in one SSH round trip.

One POSIX `sh` script prints `key=value` lines (a key may repeat, one line per GPU or device);
`parse_probe_output` turns them into the resources dict that offers and instances carry. The
script needs nothing beyond coreutils, awk and /proc, so it works before Python is known to exist.

GPU sources:
- NVIDIA: `nvidia-smi --query-gpu=name,memory.total --format=csv,noheader` ("NVIDIA L40S, 46068 MiB").
- AMD: `amd-smi static --json`, flattened onto one line (`asic.market_name`, `vram.size`; the JSON
  is a list of GPUs, or `{"gpu_data": [...]}` in newer releases; the size is a number of MB, a
  "N MB" string, or `{"value": N, "unit": "MB"}` depending on the release). When that fails,
  `amd-smi list` gives at least the count ("GPU: N" blocks) with names left empty.
- TPU chips: `/dev/accel*` (v4 and earlier) or `/dev/vfio/<n>` (v5e and later), counted only when the
  PCI vendor is Google (0x1ae0), because NVIDIA 570+ drivers also create /dev/accel* nodes and other
  passthrough devices create /dev/vfio groups. A device whose vendor cannot be read counts only when
  no NVIDIA GPU was found. The TPU type (v5e-8, ...) is not visible from inside the VM; the TPU API is
  the source of truth for it, so `tpu` stays None here.

Docker: `docker info` (10 s timeout) gives the daemon's version and runtimes; `docker` is None when
there is no CLI or the daemon does not answer. Jobs with `image` are placed only where it is set.

The internal IP a host reports is its own word, and the server later connects to it (the dstack
gateway forwards a job's port there), so `probe` holds it to the SSH host policy, the same function
every SSH connection uses: a host reporting 127.0.0.1 or 169.254.169.254 fails its registration.
"""

from __future__ import annotations

import ipaddress
import json
import re
from typing import Any

import paramiko

from backends.ssh.address_policy import host_policy, refusal
from backends.ssh.commands import run
from backends.ssh.errors import SSHError

GOOGLE_PCI_VENDOR = "0x1ae0"

PROBE_SCRIPT = r"""
export LC_ALL=C
echo "cpus=$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null)"
awk '/^MemTotal:/ {print "mem_kb=" $2}' /proc/meminfo 2>/dev/null
df -Pk / 2>/dev/null | awk 'NR==2 {print "disk_kb=" $2}'
echo "arch=$(uname -m)"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/nvidia=/'
fi
if command -v amd-smi >/dev/null 2>&1; then
  j=$(amd-smi static --json 2>/dev/null | tr -d '\n\r')
  if [ -n "$j" ]; then
    echo "amd_json=$j"
  else
    amd-smi list 2>/dev/null | sed -n 's/^GPU: *\([0-9][0-9]*\).*/amd_list=\1/p'
  fi
fi
for d in /dev/accel[0-9]*; do
  [ -e "$d" ] || continue
  n=${d#/dev/accel}
  v=$(cat "/sys/class/accel/accel$n/device/vendor" 2>/dev/null)
  echo "tpu_dev=$d:$v"
done
for d in /dev/vfio/[0-9]*; do
  [ -e "$d" ] || continue
  n=${d#/dev/vfio/}
  v=$(cat /sys/kernel/iommu_groups/"$n"/devices/*/vendor 2>/dev/null | head -n 1)
  echo "tpu_dev=$d:$v"
done
if command -v ip >/dev/null 2>&1; then
  ip -o -4 addr show scope global 2>/dev/null | awk '{print "ipv4=" $4}'
fi
for a in $(hostname -I 2>/dev/null); do echo "hostname_ip=$a"; done
echo "python3=$(command -v python3 2>/dev/null)"
"""

# Also run alone by the health checks (instances/docker_facts.py), so a host that gets Docker
# after registration, or loses it, is known without registering it again.
DOCKER_SCRIPT = r"""
if command -v docker >/dev/null 2>&1; then
  # the daemon's version and runtimes (nvidia once nvidia-container-toolkit is set up); empty when
  # the daemon does not answer or this user may not use it. A daemon that is there but hung (124:
  # `timeout` ended it) says nothing about whether Docker is installed, so it is reported apart.
  d=$(timeout 10 docker info --format '{{.ServerVersion}}|{{range $k, $v := .Runtimes}}{{$k}},{{end}}' 2>/dev/null)
  [ $? = 124 ] && echo "docker_timeout=1"
  echo "docker=$(printf '%s' "$d" | head -c 2000 | head -n 1)"
fi
"""
PROBE_SCRIPT += DOCKER_SCRIPT


def probe(client: paramiko.SSHClient, timeout: float = 20) -> dict[str, Any]:
    status, out, err = run(client, "sh -s", timeout=timeout, stdin=PROBE_SCRIPT.encode())
    if status != 0:
        raise SSHError(
            f"the resource probe exited with status {status}: {err.decode(errors='replace')[-300:]}"
        )
    found = parse_probe_output(out.decode(errors="replace"))
    why = refusal(found["internal_ip"], host_policy()) if found["internal_ip"] else ""
    if why:
        raise SSHError(
            f"the host reports its internal IP as {found['internal_ip']}, which the server does not connect to: "
            f"{why}. Jobs' ports are reached at that address, so give the host a private address the policy "
            "allows (its first global address in `ip addr`), or change the policy")
    return found


def probe_docker(client: paramiko.SSHClient, timeout: float = 20) -> dict[str, Any] | None:
    """Only the Docker part of the probe: {version, runtimes}, or None where no daemon answers.

    A `docker info` that timed out raises SSHError: a hung or restarting daemon is not "no Docker",
    and the health check keeps what it knew (instances/docker_facts.py)."""
    status, out, err = run(client, "sh -s", timeout=timeout, stdin=DOCKER_SCRIPT.encode())
    if status != 0:
        raise SSHError(f"the Docker probe exited with status {status}: {err.decode(errors='replace')[-300:]}")
    text = out.decode(errors="replace")
    if "docker_timeout=1" in text.splitlines():
        raise SSHError("`docker info` did not answer within 10 s")
    return parse_probe_output(text)["docker"]


def parse_probe_output(text: str) -> dict[str, Any]:
    values: dict[str, list[str]] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values.setdefault(key.strip(), []).append(value.strip())

    def first(key: str) -> str:
        return values.get(key, [""])[0]

    gpus = [g for g in (_nvidia_gpu(line) for line in values.get("nvidia", [])) if g]
    if not gpus:
        gpus = _amd_gpus(first("amd_json"), len(values.get("amd_list", [])))
    internal_ip, network = _address(values.get("ipv4", []), values.get("hostname_ip", []))
    return {
        "cpus": _int(first("cpus")),
        "memory_gb": _gb(_int(first("mem_kb")) / 1024 / 1024),
        "disk_gb": _gb(_int(first("disk_kb")) / 1024 / 1024),
        "cpu_arch": _arch(first("arch")),
        "gpus": gpus,
        "tpu": None,
        "tpu_chips": _tpu_chips(
            values.get("tpu_dev", []), has_nvidia=any(g["vendor"] == "nvidia" for g in gpus)
        ),
        "internal_ip": internal_ip,
        "network": network,
        "python3": first("python3"),
        "docker": _docker(first("docker")),
    }


def _docker(line: str) -> dict[str, Any] | None:
    """{version, runtimes} of a Docker daemon that answered the probe, else None (no Docker)."""
    version, _, runtimes = line.partition("|")
    if not version.strip():
        return None
    return {"version": version.strip()[:64], "runtimes": sorted({r for r in runtimes.split(",") if r})[:16]}


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        return 0


def _gb(value: float) -> float:
    return round(value, 1)


def _arch(machine: str) -> str:
    machine = machine.lower()
    if machine in ("x86_64", "amd64") or re.fullmatch(r"i[3-6]86", machine):
        return "x86"
    if machine in ("aarch64", "arm64") or machine.startswith("armv"):
        return "arm"
    return machine


_MEMORY = re.compile(r"^\s*([\d.]+)\s*([KMGT]i?B)?\s*$", re.IGNORECASE)
_TO_GB = {
    "kib": 1 / 1024 / 1024,
    "kb": 1 / 1024 / 1024,
    "mib": 1 / 1024,
    "mb": 1 / 1024,
    "gib": 1,
    "gb": 1,
    "tib": 1024,
    "tb": 1024,
}


def _memory_gb(text: str, default_unit: str = "mib") -> float | None:
    match = _MEMORY.match(text)
    if not match:
        return None
    unit = (match.group(2) or default_unit).lower()
    return _gb(float(match.group(1)) * _TO_GB[unit])


def _nvidia_gpu(line: str) -> dict[str, Any] | None:
    # "NVIDIA L40S, 46068 MiB" (or "46068" with nounits); the name itself never contains a comma.
    name, sep, memory = line.rpartition(",")
    if not sep:
        return None
    memory_gb = _memory_gb(memory)
    if memory_gb is None:
        return None
    name = name.strip()
    if name.startswith("NVIDIA "):
        name = name[len("NVIDIA ") :]
    return {"name": name, "memory_gb": memory_gb, "vendor": "nvidia"}


def _amd_gpus(raw_json: str, listed: int) -> list[dict[str, Any]]:
    try:
        data = json.loads(raw_json) if raw_json else None
    except ValueError:
        data = None
    if isinstance(data, dict):
        data = data.get("gpu_data", [data])
    if not isinstance(data, list):
        return [{"name": "", "memory_gb": 0.0, "vendor": "amd"} for _ in range(listed)]
    gpus = []
    for entry in data:
        if not isinstance(entry, dict):
            continue
        asic = entry.get("asic") if isinstance(entry.get("asic"), dict) else {}
        vram = entry.get("vram") if isinstance(entry.get("vram"), dict) else {}
        name = str(asic.get("market_name") or "").strip()
        for prefix in ("AMD Instinct ", "AMD Radeon ", "AMD "):
            if name.startswith(prefix):
                name = name[len(prefix) :]
                break
        gpus.append({"name": name, "memory_gb": _amd_size_gb(vram.get("size")), "vendor": "amd"})
    return gpus


def _amd_size_gb(size: Any) -> float:
    if isinstance(size, dict):
        if size.get("value") is None:
            return 0.0
        return _memory_gb(f"{size['value']} {size.get('unit') or 'MB'}") or 0.0
    if isinstance(size, int | float):
        return _gb(size / 1024)  # amd-smi reports vram in MB
    if isinstance(size, str):
        return _memory_gb(size, default_unit="mb") or 0.0
    return 0.0


def _tpu_chips(devices: list[str], has_nvidia: bool) -> int:
    chips = 0
    for device in devices:
        _path, _sep, vendor = device.rpartition(":")
        vendor = vendor.strip().lower()
        if vendor == GOOGLE_PCI_VENDOR or (not vendor and not has_nvidia):
            chips += 1
    return chips


def _address(ipv4_with_prefix: list[str], plain: list[str]) -> tuple[str, str]:
    for item in ipv4_with_prefix:
        try:
            iface = ipaddress.IPv4Interface(item)
        except ValueError:
            continue
        return str(iface.ip), str(iface.network)
    for item in plain:
        try:
            # Without `ip` the prefix length is unknown, so no network is claimed.
            return str(ipaddress.IPv4Address(item)), ""
        except ValueError:
            continue
    return "", ""
