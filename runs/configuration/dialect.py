"""dstack's keys that Muster accepts but that do not (yet) change how it runs a task.

A dstack user's configuration must plan unchanged, and no key may be dropped without a word: each
key here is read with dstack's types and defaults, and each one written either takes effect
(`spot_policy` on a gcp fleet, `retry`, ...) or adds a warning to the plan that says why not. A
key that cannot mean anything here (code upload, a backend Muster does not have, network volumes)
is an error that names what Muster supports. docs/configuration.md has the whole table.
"""

from __future__ import annotations

import posixpath
import re
from typing import Any, Literal

from pydantic import field_validator

from backends.registry import written_names

from .durations import parse_duration, parse_optional_duration
from .errors import ErrorList
from .fields import WrittenModel

PYTHON_VERSIONS = ("3.9", "3.10", "3.11", "3.12", "3.13")
# Every backend a dstack configuration may name that Muster has not; Muster's own (and a
# deployment's extra ones) are the registry's (backends/registry.py: written_names).
DSTACK_ONLY_BACKENDS = (
    "amddevcloud", "aws", "azure", "cloudrift", "crusoe", "cudo", "datacrunch", "digitalocean", "dstack",
    "hotaisle", "kubernetes", "lambda", "nebius", "oci", "runpod", "tensordock", "vastai", "verda", "vultr",
)  # fmt: skip
SUPPORTED_BACKENDS_TEXT = "gcp (TPU fleets), local and ssh fleets (dstack's `remote`)"
_UNIX_USER = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_.-]*(?::[A-Za-z0-9_.][A-Za-z0-9_.-]*)?$")

SpotPolicy = Literal["spot", "on-demand", "auto"]
CreationPolicy = Literal["reuse", "reuse-or-create"]
TerminationPolicy = Literal["dont-destroy", "destroy-after-idle"]
CONTAINER_KEYS = (
    "image", "python", "nvcc", "privileged", "user", "entrypoint", "working_dir", "shell",
    "registry_auth", "docker", "home_dir",
)  # fmt: skip
WHY_CONTAINERS = "takes effect once jobs run in containers; until then the commands run on the host"
# Container keys the runner applies (runner/containers.py): no warning for them.
CONTAINER_KEYS_IN_EFFECT = ("image", "privileged", "user", "entrypoint", "working_dir", "shell", "registry_auth")
WITHOUT_IMAGE = "takes effect only for jobs with `image`: this task has none, so its commands run on the host"



class _RegistryAuth(WrittenModel):
    username: str
    password: str


class _Utilization(WrittenModel):
    min_gpu_utilization: int
    time_window: Any

    @field_validator("min_gpu_utilization")
    @classmethod
    def _percent(cls, value: int) -> int:
        if not 0 <= value <= 100:
            raise ValueError("min_gpu_utilization is a percentage, 0..100")
        return value

    @field_validator("time_window")
    @classmethod
    def _window(cls, value: object) -> int:
        seconds = parse_duration(value)
        if seconds < 300:
            raise ValueError("time_window must be at least 5m")
        return seconds


class _Schedule(WrittenModel):
    cron: str | list[str]


class _RetryPolicy(WrittenModel):
    """dstack's deprecated `retry_policy`; read so it can be named in the warning."""

    retry: bool = False
    duration: Any = None

    @field_validator("duration")
    @classmethod
    def _duration(cls, value: object) -> int | None:
        return None if value is None else parse_duration(value)


def _off_duration(value: object) -> int | None | Literal[-1]:
    if value is None or value is True:
        return None
    parsed = parse_optional_duration(value)
    return -1 if parsed is None else parsed  # -1: `off`, kept apart from "not written"


class ContainerKeys(WrittenModel):
    """The container keys of dstack's run configurations."""

    image: str | None = None
    python: Any = None
    nvcc: bool | None = None
    privileged: bool = False
    user: str | None = None
    entrypoint: str | None = None
    working_dir: str | None = None
    home_dir: str | None = None  # deprecated by dstack, no effect there either
    shell: str | None = None
    registry_auth: _RegistryAuth | None = None
    docker: bool | None = None
    single_branch: bool | None = None
    volumes: list[Any] = []
    repos: list[Any] = []
    files: list[Any] = []

    @field_validator("python", mode="before")
    @classmethod
    def _python(cls, value: object) -> str | None:
        if value is None:
            return None
        if isinstance(value, float):
            # YAML reads `python: 3.10` as the number 3.1
            value = "3.10" if str(value) == "3.1" else str(value)
        if not isinstance(value, str) or value.strip() not in PYTHON_VERSIONS:
            raise ValueError(f"python must be one of {', '.join(PYTHON_VERSIONS)}")
        return value.strip()

    @field_validator("user")
    @classmethod
    def _user(cls, value: str | None) -> str | None:
        if value is not None and not _UNIX_USER.fullmatch(value):
            raise ValueError("user must be `name_or_id[:group_name_or_id]`, e.g. ubuntu or 1000:1000")
        return value

    @field_validator("shell")
    @classmethod
    def _shell(cls, value: str | None) -> str | None:
        if value is not None and value not in ("sh", "bash") and not posixpath.isabs(value):
            raise ValueError("shell must be sh, bash or an absolute path like /usr/bin/zsh")
        return value

    @field_validator("working_dir")
    @classmethod
    def _working_dir(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("working_dir cannot be empty")
        return value

    @field_validator("volumes")
    @classmethod
    def _volumes(cls, value: list[Any]) -> list[dict[str, Any]]:
        return [_volume(item) for item in value]


def _volume(item: object) -> dict[str, Any]:
    """`/host/path:/path` or {instance_path, path, optional}: an instance volume (a host directory);
    `name:/path` or {name, path}: a network volume, which Muster does not have."""
    if isinstance(item, str):
        source, sep, path = item.rpartition(":")
        if not sep or not source or not path.startswith("/"):
            raise ValueError(f"cannot read volume `{item}`: write /host/path:/container/path")
        item = {"instance_path": source, "path": path} if source.startswith("/") else {"name": source, "path": path}
    if not isinstance(item, dict):
        raise ValueError("a volume is `/host/path:/container/path` or a mapping")
    if "name" in item:
        raise ValueError(
            f"network volume `{item['name']}` is not supported: Muster has no network volumes; "
            "use an instance volume, /host/path:/container/path"
        )
    unknown = [str(k) for k in item if k not in ("instance_path", "path", "optional")]
    if unknown:
        raise ValueError(f"unknown key `{unknown[0]}` in a volume: use instance_path, path, optional")
    if not isinstance(item.get("instance_path"), str) or not isinstance(item.get("path"), str):
        raise ValueError("an instance volume needs instance_path and path")
    if not item["path"].startswith("/"):
        raise ValueError(f"volume path `{item['path']}` must be absolute")
    optional = item.get("optional", False)
    if not isinstance(optional, bool):
        raise ValueError("optional must be true or false")
    return {"instance_path": item["instance_path"], "path": item["path"], "optional": optional}


# dstack's bounds and default for `priority` (dstack 0.22.5, RUN_PRIORITY_DEFAULT): a waiting run of a
# higher priority gets a freed host first (docs/queueing.md)
PRIORITY_MIN, PRIORITY_MAX, PRIORITY_DEFAULT = 0, 100, 0


class ProfileKeys(WrittenModel):
    """dstack's profile keys (where to provision and for how long), as a run takes them."""

    backends: list[str] | None = None
    regions: list[str] | None = None
    availability_zones: list[str] | None = None
    instance_types: list[str] | None = None
    reservation: str | None = None
    spot_policy: SpotPolicy | None = None
    max_price: float | None = None
    creation_policy: CreationPolicy | None = None
    idle_duration: Any = None
    stop_duration: Any = None
    utilization_policy: _Utilization | None = None
    schedule: _Schedule | None = None
    priority: int | None = None
    # Muster's (dstack has no preemption): a waiting run of a higher priority may stop this one, with its
    # stop_duration's grace, to take its hosts; it ends as an interruption (docs/queueing.md)
    preemptible: bool | None = None
    tags: dict[str, str] | None = None
    # deprecated by dstack
    termination_policy: TerminationPolicy | None = None
    termination_idle_time: Any = None
    pool_name: str | None = None
    instance_name: str | None = None
    retry_policy: _RetryPolicy | None = None

    @field_validator("backends")
    @classmethod
    def _backends(cls, value: list[str] | None) -> list[str] | None:
        return check_backends(value, lacking_ok=True)

    @field_validator("max_price")
    @classmethod
    def _price(cls, value: float | None) -> float | None:
        return check_max_price(value)

    @field_validator("priority", mode="before")
    @classmethod
    def _priority(cls, value: object) -> int | None:
        # strict: `priority: true` or `50.5` is a mistake to name, not a number to round (dstack's bounds)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"priority must be a whole number from 0 to 100, not {value!r}")
        if not PRIORITY_MIN <= value <= PRIORITY_MAX:
            raise ValueError(f"priority must be 0..100 (higher is placed first), not {value}")
        return value

    @field_validator("preemptible", mode="before")
    @classmethod
    def _preemptible(cls, value: object) -> bool | None:
        if value is not None and not isinstance(value, bool):  # strict: `preemptible: "yes"` or 1 is a mistake
            raise ValueError(f"preemptible must be true or false, not {value!r}")
        return value

    @field_validator("idle_duration", "stop_duration")
    @classmethod
    def _durations(cls, value: object) -> int | None:
        return _off_duration(value)

    @field_validator("termination_idle_time")
    @classmethod
    def _idle_time(cls, value: object) -> int | None:
        return None if value is None else parse_duration(value)


def check_max_price(value: float | None) -> float | None:
    if value is not None and not value > 0:
        raise ValueError("max_price must be more than 0 (dollars per hour)")
    return value


def check_backends(value: list[str] | None, lacking_ok: bool = False) -> list[str] | None:
    """`lacking_ok`: a run's backends, where a dstack backend Muster lacks (`crusoe` in dstack's own
    examples) is accepted, as dstack does: the run goes only to fleets of the named kinds, and finds
    none of it (backends_warning). A fleet is made by its backend: one Muster lacks is refused."""
    if value is None:
        return None
    for name in value:
        if name not in DSTACK_ONLY_BACKENDS and name not in written_names():
            raise ValueError(f"unknown backend `{name}`: Muster supports {SUPPORTED_BACKENDS_TEXT}")
        if name not in written_names() and not lacking_ok:
            raise ValueError(f"Muster has no `{name}` backend: it supports {SUPPORTED_BACKENDS_TEXT}")
    return list(dict.fromkeys(value))


def backends_warning(backends: list[str]) -> str:
    """What a task's `backends` does here: it keeps the run to fleets of those kinds."""
    lacking = [name for name in backends if name not in written_names()]
    kept = [name for name in backends if name in written_names()]
    if not lacking:
        return f"{', '.join(backends)}: the run goes only to the project's fleets of these kinds"
    missing = ", ".join(f"`{name}`" for name in lacking)
    said = f"Muster has no {missing} backend{'s' if len(lacking) > 1 else ''} (it supports {SUPPORTED_BACKENDS_TEXT})"
    if kept:
        return f"{said}: the run goes only to the project's {', '.join(kept)} fleets"
    return (f"{said}: no fleet here is of the named backends, so the run finds no capacity; "
            "remove `backends` to run on the project's fleets")


def has_image(task: Any) -> bool:
    """Whether any job of the task runs in a container (the top-level image, or a group's)."""
    return bool(task.image) or any(isinstance(g, dict) and g.get("image") for g in task.groups or [])


def _warn(warnings: list, field: str, message: str) -> None:
    warnings.append({"field": [field], "message": f"{field}: {message}"})


def check_task_keys(task: Any, errors: ErrorList, warnings: list) -> None:
    """Cross-key rules of dstack's keys, and a warning for each written key that has no effect."""
    written = task.model_fields_set
    if task.repos:
        errors.add(["repos"], "Muster does not clone repos (it has no code upload): remove `repos` "
                   "and fetch the code in `commands` (e.g. git clone)")
    if task.files:
        errors.add(["files"], "Muster does not upload files (it has no code upload): remove `files` "
                   "and fetch them in `commands`")
    if task.image and task.python:
        errors.add(["python"], "`image` and `python` cannot be used together (as in dstack)")
    if task.docker:
        for other in ("image", "python", "nvcc"):
            if getattr(task, other):
                errors.add(["docker"], f"`{other}` and `docker` cannot be used together (as in dstack)")

    if task.python:
        _warn(warnings, "python", f"{task.python} — this server has no default image for Python {task.python}: "
              "set image, or the commands run with the host's Python")
    for key in CONTAINER_KEYS:
        if key == "python" or key not in written or getattr(task, key) in (None, False):
            continue
        value = getattr(task, key)
        shown = "(set)" if key == "registry_auth" else str(value).lower() if isinstance(value, bool) else value
        if key in CONTAINER_KEYS_IN_EFFECT:
            if not has_image(task):
                _warn(warnings, key, f"{shown} {WITHOUT_IMAGE}")
            continue
        _warn(warnings, key, f"{shown} is accepted but {WHY_CONTAINERS}")
    if task.volumes and not has_image(task):
        _warn(warnings, "volumes", f"instance volumes {WITHOUT_IMAGE}: use the host paths directly")
    if "single_branch" in written:
        _warn(warnings, "single_branch", "has no effect: Muster clones no repos")
    if task.setup:
        _warn(warnings, "setup", "deprecated by dstack; Muster runs these commands before `commands` on every node")

    profile_notes = {
        "regions": "regions are set on a fleet; a run goes to any fleet it fits",
        "availability_zones": "zones are set on a fleet (gcp fleets: `zones`); a run goes to any fleet it fits",
        "instance_types": "Muster picks hosts by `resources`, not by instance type",
        "reservation": "Muster has no cloud reservations",
        "spot_policy": f"{task.spot_policy} is decided by the fleet (a gcp fleet's `spot_policy`); "
        "the run takes the capacity of the fleet it goes to",
        "max_price": "Muster does not know instance prices",
        "creation_policy": "runs always reuse the project's fleets; gcp fleets create TPU slices as runs need them",
        "idle_duration": "idle hosts are kept by the fleet's `idle_duration`",
        "utilization_policy": "GPU utilization is not measured",
        "schedule": "runs are not scheduled: submit them when they should start",
        "tags": "Muster creates no cloud resources from a run to tag",
        "termination_policy": "deprecated by dstack: idle hosts are kept by the fleet's `idle_duration`",
        "termination_idle_time": "deprecated by dstack: idle hosts are kept by the fleet's `idle_duration`",
        "pool_name": "deprecated by dstack: use `fleets`",
        "instance_name": "deprecated by dstack: use `fleets`",
        "retry_policy": "deprecated by dstack: write `retry` instead",
    }
    if "backends" in written and task.backends is not None:
        _warn(warnings, "backends", backends_warning(task.backends))
    for key, note in profile_notes.items():
        if key in written and getattr(task, key) is not None:
            _warn(warnings, key, f"has no effect here: {note}")


def container_values(task: Any) -> dict[str, Any]:
    """The written container keys, normalized, without the registry password."""
    keys = [k for k in CONTAINER_KEYS if k not in ("image", "registry_auth")]
    out = {k: getattr(task, k) for k in keys if k in task.model_fields_set}
    if task.registry_auth is not None:
        out["registry_auth"] = {"username": task.registry_auth.username}
    if task.volumes:
        out["volumes"] = task.volumes
    return out


def profile_values(task: Any) -> dict[str, Any]:
    keys = [k for k in ProfileKeys.model_fields if k != "retry_policy"]
    out = {}
    for key in keys:
        value = getattr(task, key)
        if key in task.model_fields_set and value is not None:
            out[key] = value.model_dump() if isinstance(value, WrittenModel) else value
    return out
