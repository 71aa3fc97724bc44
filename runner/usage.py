"""What a running job uses on its host, sampled by its job runner: CPU, memory and GPUs.

A thread of the job runner takes a sample every SAMPLE_INTERVAL seconds and writes it to the
job's usage.json; ``status`` reports it with the job, so the server learns it from the look it
makes anyway, never from a call of its own (as probes.json).

- CPU and memory of the job's own processes: from the job's cgroup where it has one (cgroup v2
  ``cpu.stat`` usage_usec and ``memory.current``), else summed over its processes from /proc
  (``stat`` utime+stime plus the times of the children they reaped, ``statm`` resident pages).
  CPU is in percent of one core over the last interval: a job busy on 4 cores shows 400. A
  container job's processes are the container's init process and its descendants (ContainerPids).
- GPUs: the host's, as ``nvidia-smi --query-gpu=... --format=csv,noheader,nounits`` prints them,
  where there is an nvidia-smi (whole-GPU figures: a GPU is not split between jobs here).
- TPUs: nothing. libtpu serves its runtime metrics over gRPC, read by Google's ``tpu-info`` CLI,
  which prints tables for people; a standard-library runner has no client for that service.

Everything read here may be anything (someone else's nvidia-smi, a full /proc): each reader has a
timeout or a size cap and gives up quietly; the server checks every value again (runs/usage.py).
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import threading
import time
from typing import Any, Callable

from .files import JobPaths, write_json_atomic
from .images import docker
from .processes import pid_alive

SAMPLE_INTERVAL = 5.0
NVIDIA_SMI_TIMEOUT = 5.0
NVIDIA_SMI_CAP = 64 * 1024  # bytes of its output read; a GPU is one short line
MAX_GPUS = 64
GPU_QUERY = "index,utilization.gpu,memory.used,memory.total"
MIB = 1024 * 1024
USAGE_FILE_CAP = 16 * 1024  # a sample with MAX_GPUS GPUs is under 8 KiB


def usage_path(job: JobPaths) -> str:
    return os.path.join(job.dir, "usage.json")


def read_usage(job: JobPaths) -> dict[str, Any] | None:
    """The last sample, for ``status``; None without one, or when the file is larger than a sample
    can be (the job may write its own directory: its status must stay small enough to be read)."""
    text = _read(usage_path(job), USAGE_FILE_CAP + 1)
    if text is None or len(text) > USAGE_FILE_CAP:
        return None
    try:
        sample = json.loads(text)
    except ValueError:
        return None
    return sample if isinstance(sample, dict) else None


def _read(path: str, cap: int = 64 * 1024) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(cap).decode("ascii", "replace")
    except OSError:
        return None


def cgroup_cpu_seconds(cgroup: str) -> float | None:
    """CPU time of everything that ever ran in the cgroup (v2 cpu.stat), or None."""
    text = _read(os.path.join(cgroup, "cpu.stat")) if cgroup else None
    for line in (text or "").splitlines():
        name, _, value = line.partition(" ")
        if name == "usage_usec" and value.strip().isdigit():
            return int(value) / 1e6
    return None


def cgroup_memory_bytes(cgroup: str) -> int | None:
    text = _read(os.path.join(cgroup, "memory.current")) if cgroup else None
    return int(text.strip()) if text and text.strip().isdigit() else None


def proc_cpu_seconds(pids: list[int]) -> float:
    """utime+stime+cutime+cstime of the live processes: a child's time moves into its parent's
    c-times when reaped, so the sum only drops when a process whose parent is not the job's ends."""
    ticks = 0
    for pid in pids:
        raw = _read(f"/proc/{pid}/stat", 4096)
        fields = raw[raw.rfind(")") + 2:].split() if raw else []
        if len(fields) > 14:
            ticks += sum(int(v) for v in fields[11:15] if v.lstrip("-").isdigit())
    return ticks / os.sysconf("SC_CLK_TCK")


def proc_memory_bytes(pids: list[int]) -> int:
    """Resident memory summed over the processes (pages two processes share count twice)."""
    pages = 0
    for pid in pids:
        fields = (_read(f"/proc/{pid}/statm", 4096) or "").split()
        if len(fields) > 1 and fields[1].isdigit():
            pages += int(fields[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


def process_tree(root: int) -> list[int]:
    """`root` and every live process descended from it (parents read from /proc/<pid>/stat)."""
    if root <= 0 or not pid_alive(root):
        return []
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        raw = _read(f"/proc/{name}/stat", 4096) if name.isdigit() else None
        fields = raw[raw.rfind(")") + 2:].split() if raw else []
        if len(fields) > 1 and fields[1].isdigit():
            children.setdefault(int(fields[1]), []).append(int(name))
    found, todo = [], [root]
    while todo and len(found) < 100_000:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


class ContainerPids:
    """The processes of a container job: its init process (Docker's State.Pid, asked again only when
    it is gone) and its descendants. They are not in the job's cgroup nor carry its marker."""

    def __init__(self, name: str) -> None:
        self.name, self.pid = name, 0

    def __call__(self) -> list[int]:
        if self.pid <= 0 or not pid_alive(self.pid):
            code, out = docker(["inspect", "--format", "{{.State.Pid}}", "--", self.name])
            self.pid = int(out.strip()) if code == 0 and out.strip().isdigit() else 0
        return process_tree(self.pid)


def host_memory_bytes() -> int | None:
    for line in (_read("/proc/meminfo") or "").splitlines():
        if line.startswith("MemTotal:"):
            parts = line.split()
            return int(parts[1]) * 1024 if len(parts) > 1 and parts[1].isdigit() else None
    return None


def _number(text: str) -> float | None:
    """A finite number or None: "[N/A]", "nan", "1e999" and words are all None."""
    try:
        value = float(text.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def parse_nvidia_smi(text: str) -> list[dict[str, Any]]:
    """GPUs from GPU_QUERY's CSV lines; a line that is not four fields is skipped."""
    gpus = []
    for line in text.splitlines()[:MAX_GPUS]:
        fields = line.split(",")
        if len(fields) != 4:
            continue
        index, util, used, total = (_number(f) for f in fields)
        if index is None or not 0 <= index < 1024 or index != int(index):
            continue
        gpus.append({"index": int(index), "util_percent": util,
                     "memory_used_bytes": None if used is None else int(used * MIB),
                     "memory_total_bytes": None if total is None else int(total * MIB)})
    return gpus


def gpu_usage() -> list[dict[str, Any]]:
    """The host's GPUs as nvidia-smi reports them; [] without one or when it fails or hangs."""
    try:
        proc = subprocess.Popen(["nvidia-smi", f"--query-gpu={GPU_QUERY}", "--format=csv,noheader,nounits"],
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                start_new_session=True, close_fds=True)
    except OSError:
        return []
    # its whole group: a child that kept the pipe open would hold the read past the timeout
    timer = threading.Timer(NVIDIA_SMI_TIMEOUT, _kill_group, (proc.pid,))
    timer.start()
    try:
        out = proc.stdout.read(NVIDIA_SMI_CAP) if proc.stdout else b""
        _kill_group(proc.pid)  # whatever it still had to say is past the cap
        proc.wait()
    finally:
        timer.cancel()
        if proc.stdout:
            proc.stdout.close()
    return parse_nvidia_smi(out.decode("utf-8", "replace"))


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass


class Sampler:
    """One thread: a sample now, then every ``interval`` until stopped; the last one in usage.json."""

    def __init__(self, job: JobPaths, cgroup: str, pids: Callable[[], list[int]],
                 interval: float = SAMPLE_INTERVAL) -> None:
        self.job, self.cgroup, self.pids, self.interval = job, cgroup, pids, interval
        self.stopped = threading.Event()
        self.last: tuple[float, float] | None = None  # (monotonic time, CPU seconds) of the last sample

    def start(self) -> Sampler:
        threading.Thread(target=self._loop, name="usage", daemon=True).start()
        return self

    def stop(self) -> None:
        self.stopped.set()

    def _loop(self) -> None:
        while not self.stopped.is_set():
            try:
                write_json_atomic(usage_path(self.job), self.sample())
            except Exception:  # noqa: BLE001 - a sample is never worth the job runner's life
                pass
            self.stopped.wait(self.interval)

    def sample(self) -> dict[str, Any]:
        cpu = cgroup_cpu_seconds(self.cgroup)
        memory = cgroup_memory_bytes(self.cgroup)
        pids = self.pids() if cpu is None or memory is None else []
        if cpu is None:
            cpu = proc_cpu_seconds(pids)
        if memory is None:
            memory = proc_memory_bytes(pids)
        now = time.monotonic()
        percent = None
        if self.last is not None and now > self.last[0]:
            percent = max(0.0, (cpu - self.last[1]) / (now - self.last[0]) * 100)
        self.last = (now, cpu)
        return {"t": time.time(), "cpu_percent": None if percent is None else round(percent, 1),
                "cpus": os.cpu_count() or 1, "memory_bytes": memory, "memory_total_bytes": host_memory_bytes(),
                "gpus": gpu_usage()}
