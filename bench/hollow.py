"""Hollow instances, like Kubernetes kubemark's hollow nodes: rows the engine schedules onto, with a
runner that starts no process.

`HollowCompute` is a static fleet backend (creates_groups False): its instances are rows made by
`make_hollow_fleet`, placed by engine/submitted/placement.take_instances exactly like SSH hosts. Its runner host
answers in microseconds: the agent is always alive, and a job handed to it reports `running` for
MUSTER["HOLLOW_RUN_SECONDS"] after its submit and then `done` (exit status 0); a job whose commands
include `hollow: fail-once` fails instead (exit status 1) the first time its node runs on the
instance, so a restart on the same host (`on_failure: restart-group`) then succeeds.

State: one small JSON file per instance under MUSTER_DATA_DIR/hollow/ ({runner job id: submit
time}), written at submit and cleanup, read by status(). It costs no database statement and no
broker round trip, and it survives a Redis restart (bench/chaos.py restarts Redis).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from django.conf import settings

from backends.base import BackendError, Compute, InstanceOffer, ProvisioningData, RunnerHost

BACKEND = "hollow"
FAIL_ONCE = "hollow: fail-once"
FAILS = ":fails"  # beside a job id in the state file: that job ends failed


def state_dir() -> Path:
    path = Path(settings.DATA_DIR) / "hollow"
    path.mkdir(parents=True, exist_ok=True)
    return path


def run_seconds() -> float:
    return float(settings.MUSTER["HOLLOW_RUN_SECONDS"])


class HollowRunnerHost(RunnerHost):
    def __init__(self, instance_id: int, seconds: float | None = None):
        self.path = state_dir() / f"{instance_id}.json"
        self.seconds = seconds  # how long a job runs here (None: MUSTER["HOLLOW_RUN_SECONDS"])

    def _load(self) -> dict[str, float]:
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}

    def _save(self, jobs: dict[str, float]) -> None:
        tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(jobs))
        os.replace(tmp, self.path)

    def ensure_agent(self, revive: bool = False) -> None:
        return None

    def submit(self, job_id: str, spec: dict[str, Any]) -> None:
        jobs = self._load()
        if job_id not in jobs:  # idempotent by job id: a second submit keeps the first start time
            jobs[job_id] = time.time()
            if FAIL_ONCE in (spec.get("commands") or []):
                marks = self.path.with_suffix(".failed")
                node = f"{spec.get('run_name')}/{spec.get('job_num')}"
                seen = marks.read_text().split() if marks.exists() else []
                if node not in seen:
                    marks.write_text(" ".join([*seen, node]))
                    jobs[f"{job_id}{FAILS}"] = 1.0
            self._save(jobs)

    def status(self) -> dict[str, Any]:
        now = time.time()
        jobs = {}
        seconds = run_seconds() if self.seconds is None else self.seconds
        found = self._load()
        for job_id, started in found.items():
            if job_id.endswith(FAILS):
                continue
            if f"{job_id}{FAILS}" in found and now - started >= seconds:
                jobs[job_id] = {"state": "failed", "start_time": started, "end_time": started + seconds,
                                "exit_status": 1}
            elif now - started < seconds:
                jobs[job_id] = {"state": "running", "start_time": started, "log_size": 0}  # prints nothing
            else:
                jobs[job_id] = {"state": "done", "start_time": started, "end_time": started + seconds,
                                "exit_status": 0}
        return {"now": now, "agent": {"pid": 0, "time": now}, "agent_alive": True, "jobs": jobs}

    def stop(self, job_id: str) -> None:
        return None  # nothing runs; status() reports the job done once its time is over

    def read_log(self, job_id: str, offset: int = 0, limit: int = 1 << 20) -> bytes:
        return b""

    def cleanup(self, job_id: str) -> None:
        jobs = self._load()
        if jobs.pop(job_id, None) is not None:
            jobs.pop(f"{job_id}{FAILS}", None)
            self._save(jobs)


class HollowCompute(Compute):
    name = BACKEND
    creates_groups = False

    def get_offers(self, requirements: dict[str, Any]) -> list[InstanceOffer]:
        return []

    def create_instances(self, offer: InstanceOffer, count: int, names: list[str]) -> list[ProvisioningData]:
        raise BackendError("hollow fleets are made by bench.hollow.make_hollow_fleet, not created on demand")

    def terminate(self, name: str, backend_data: dict[str, Any]) -> None:
        return None

    def runner_host(self, instance: Any) -> HollowRunnerHost:
        return HollowRunnerHost(instance.pk)


def hollow_resources(gpus: int = 0) -> dict[str, Any]:
    return {
        "cpus": 8, "memory_gb": 64.0, "disk_gb": 500.0, "cpu_arch": "x86",
        "gpus": [{"name": "L40S", "memory_gb": 48.0, "vendor": "nvidia"} for _ in range(gpus)], "tpu": None,
    }


def hollow_ip(fleet_id: int, i: int) -> str:
    return f"10.{fleet_id % 250}.{(i >> 8) & 255}.{i & 255}"


def make_hollow_fleet(project, name: str, H: int, placement: str = "cluster", gpu_fraction: float = 0.0,
                      gpus_per_host: int = 8):
    """A static fleet of H idle hollow instances, written with one bulk_create."""
    from django.db import transaction
    from django.utils import timezone

    from instances.models import Fleet, Instance, InstanceStatus

    now = timezone.now()
    gpu_hosts = int(round(H * gpu_fraction))
    with transaction.atomic():
        fleet = Fleet.objects.create(
            project=project, name=name, backend=BACKEND, placement=placement,
            configuration={"type": "fleet", "name": name, "backends": [BACKEND], "nodes": H},
            network="10.0.0.0/8",
        )
        rows = [
            Instance(
                project=project, fleet=fleet, name=f"{name}-{i}", status=InstanceStatus.IDLE, backend=BACKEND,
                region="hollow", hostname=hollow_ip(fleet.pk, i), internal_ip=hollow_ip(fleet.pk, i), index=i,
                resources=res, idle_since=now, **Instance.resource_columns(res),
            )
            for i in range(H)
            for res in [hollow_resources(gpus_per_host if i < gpu_hosts else 0)]
        ]
        Instance.objects.bulk_create(rows, batch_size=2000)
    return fleet
