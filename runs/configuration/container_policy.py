"""What a fleet lets a run's containers do to its hosts: `allow_privileged` and the host paths a
volume may mount (`volumes.allowed_prefixes`).

Whoever can start a container with `--privileged` or with a bind mount of the host's `/` is root
on that host, so these are the operator's, written on the fleet, and checked twice: here, at
plan, submit and placement (host paths normalized: `..` cannot climb out of a prefix), and by
the runner on the host, which also resolves symlinks (runner/containers.py: policy_refusal).

Defaults: no host paths anywhere; privileged containers only on gcp fleets, whose TPU containers
need them (the TPU runtime opens the chips' devices directly, engine/starting/cluster.py).
"""

from __future__ import annotations

import posixpath
from typing import Any

from backends.registry import compute_class


def default_allow_privileged(backend: str) -> bool:
    return compute_class(backend).privileged_by_default


def fleet_policy(configuration: dict[str, Any], backend: str) -> dict[str, Any]:
    """The policy of a fleet as stored; a fleet stored before these keys existed gets the defaults."""
    allow = configuration.get("allow_privileged")
    volumes = configuration.get("volumes") or {}
    return {
        "allow_privileged": default_allow_privileged(backend) if allow is None else bool(allow),
        "allowed_prefixes": list(volumes.get("allowed_prefixes") or []),
    }


def normal_path(path: str) -> str:
    """The path as the kernel would walk it, without symlinks: `..` and `//` folded (leading `//` too)."""
    return "/" + posixpath.normpath("/" + path).lstrip("/")


def within(path: str, prefixes: list[str]) -> bool:
    path = normal_path(path)
    for prefix in prefixes:
        prefix = normal_path(prefix)
        if path == prefix or path.startswith(prefix.rstrip("/") + "/"):
            return True
    return False


def check_prefix(value: str) -> str:
    """An allowed prefix as a fleet writes it: an absolute path, kept normalized."""
    if not isinstance(value, str) or not value.startswith("/"):
        raise ValueError(f"`{value}` is not an absolute host path: write e.g. /data")
    if ":" in value or "," in value:
        raise ValueError(f"`{value}`: a host path for volumes cannot hold `:` or `,` (Docker splits on them)")
    return normal_path(value)


def policy_problems(container: dict[str, Any], policy: dict[str, Any], fleet: str) -> list[tuple[list, str]]:
    """(location, message) for each thing the run's containers ask that the fleet does not allow.

    `container` is the checked run's `container` (privileged, volumes); call it only for a run
    that has an image, since the keys do nothing without one."""
    problems: list[tuple[list, str]] = []
    if container.get("privileged") and not policy["allow_privileged"]:
        problems.append((["privileged"], (
            f"fleet {fleet} does not allow privileged containers (its `allow_privileged` is false): "
            "remove `privileged: true`, or ask the fleet's operator to set allow_privileged: true")))
    prefixes = policy["allowed_prefixes"]
    for i, volume in enumerate(container.get("volumes") or []):
        source = volume.get("instance_path") if isinstance(volume, dict) else None
        if not isinstance(source, str):
            continue
        if ":" in source or "," in source:
            problems.append((["volumes", i], f"host path `{source}` cannot hold `:` or `,`: Docker splits on them"))
        elif not within(source, prefixes):
            allowed = ", ".join(prefixes) if prefixes else "none: it mounts no host paths"
            problems.append((["volumes", i], (
                f"fleet {fleet} does not allow mounting host path `{source}` (as {normal_path(source)}); "
                f"its volumes.allowed_prefixes are {allowed}: mount a path under one of them, or remove "
                "the volume")))
    return problems


def run_has_image(configuration: dict[str, Any]) -> bool:
    """Whether a stored (or dumped) run configuration runs any job in a container."""
    return bool(configuration.get("image")) or any(g.get("image") for g in configuration.get("groups") or [])
