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
