"""Words for what the console and the admin show as state, so nobody has to decode an icon."""

from __future__ import annotations

from instances.models import InstanceStatus


def health(instance) -> str:
    """`unreachable` is a flag the engine sets when it could not talk to a host's runner
    (engine.health); a boolean icon of it reads backwards ("unreachable: no" as a red cross)."""
    if instance.status == InstanceStatus.TERMINATED:
        return "gone"
    if instance.unreachable:
        return "unreachable"
    if instance.status in (InstanceStatus.PENDING, InstanceStatus.PROVISIONING):
        return "not up yet"
    if instance.status == InstanceStatus.TERMINATING:
        return "shutting down"
    return "reachable" if instance.last_seen else "not contacted yet"


def gpus(instance) -> str:
    resources = instance.resources or {}
    listed = resources.get("gpus") or []
    if listed:
        names: dict[str, int] = {}
        for gpu in listed:
            label = gpu.get("name", "?") + (f" {gpu['memory_gb']}GB" if gpu.get("memory_gb") else "")
            names[label] = names.get(label, 0) + 1
        return ", ".join(f"{n}x {label}" for label, n in names.items())
    if resources.get("tpu") or instance.tpu:
        return f"TPU {resources.get('tpu') or instance.tpu}"
    return "none"


def docker(instance) -> str:
    value = (instance.resources or {}).get("docker")
    if value is None:
        value = (instance.backend_data or {}).get("docker")
    if value in (None, ""):
        return "not reported"
    if value is True:
        return "yes"
    if value is False:
        return "no"
    return str(value)


def seconds(total: float) -> str:
    """A duration as people read it: 42s, 3m 05s, 2h 07m."""
    total = int(total)
    if total < 60:
        return f"{total}s"
    if total < 3600:
        return f"{total // 60}m {total % 60:02d}s"
    return f"{total // 3600}h {total % 3600 // 60:02d}m"


def job_duration(job, now) -> str:
    """How long the job's commands ran (the runner's clock): to its end, or until now while it runs."""
    if job.start_time is None:
        return "-"
    end = job.end_time if job.end_time is not None else now.timestamp()
    return seconds(max(0.0, end - job.start_time))


def job_exit(job) -> str:
    return "-" if job.exit_status is None else str(job.exit_status)


def job_times(job, now) -> str:
    if job.exit_status is not None:
        code = f"exit {job.exit_status}"
    else:
        code = "no exit code" if job.finished else "not exited"
    return f"{code} · ran {job_duration(job, now)}"


def run_duration(run, now) -> str:
    """From submit to its end, or until now while it is not over."""
    return seconds(max(0.0, ((run.finished_at or now) - run.submitted_at).total_seconds()))
