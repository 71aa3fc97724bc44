"""The run configuration as stored with a run (`Run.configuration`), typed: what the engine reads.

The stored dict is the checked configuration (task_checked.TaskConfiguration, env masked) plus the
fields the server adds at submit (runs/services/submission.py): the encrypted values of the masked
env keys, their names, and the encrypted registry password. Here the user's fields and the
server's are apart (`StoredTask.server`), every field the engine reads is an attribute, and a
field an older row lacks takes the value the engine has always assumed for it (so a missing
`ready_timeout` is 0, no limit, not the parser's default). Keys the engine does not read are
ignored, so a row keeps working when a key is added or dropped.

A run has one `type`; each type is one variant (`STORED_TYPES`), told apart by `type` as the parser
tells documents apart: `task`, and `service`, whose groups are replica groups.

Built once per Run instance (`run_configuration`) and frozen: the engine asks for it on every
placement, start and watch, and one instance is shared by a run's jobs read through it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .failure_policy import DEFAULT_MAX_RESTARTS
from .readiness import Probe

# what submission.py adds to the checked configuration; never part of what the user wrote
SERVER_KEYS = ("secret_env", "hidden_env", "secret_registry_password")
ERROR, INTERRUPTION = "error", "interruption"


class _Stored(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class StoredRetry(_Stored):
    on_events: tuple[str, ...] = ()
    duration: int | None = None  # seconds; None: runs/limits.py's default


class StoredDependency(_Stored):
    group: str
    condition: str | None = None  # None: ready

    @model_validator(mode="before")
    @classmethod
    def _bare_name(cls, value: Any) -> Any:
        # a dependency may be kept as the group's name alone
        return {"group": value} if isinstance(value, str) else value


class StoredRule(_Stored):
    """One `on_failure` rule (runs/configuration/failure_policy.py)."""

    on_events: tuple[str, ...] = (ERROR, INTERRUPTION)
    on_exit_codes: tuple[int, ...] = ()  # empty: any exit status
    action: str


class StoredResources(_Stored):
    """The group's resources as far as the engine reads them from the run (the rest is matched
    from each job's own `spec`)."""

    shm_size: float | None = None


class StoredScaling(_Stored):
    """A replica group's `scaling`: dstack's ScalingSpec (`rps`: requests per second per replica), or
    Muster's `queue` (queued requests per replica, read from a Prometheus gauge the replicas serve)."""

    metric: str = "rps"
    target: float = 1.0
    window: int = 60  # seconds the rps (or the queue depth) is averaged over
    scale_up_delay: int = 300  # seconds
    scale_down_delay: int = 600  # seconds
    queue_metric: str | None = None  # metric: queue: the gauge's name
    metrics_port: int | None = None  # None: the service's port
    metrics_path: str = "/metrics"

    @model_validator(mode="before")
    @classmethod
    def _nulls_are_defaults(cls, value: Any) -> Any:
        return _without_nulls(value)


class StoredReplicas(_Stored):
    """How many replicas a service's group may have: min == max for a fixed count."""

    min: int = 1
    max: int = 1


class StoredWorker(_Stored):
    """A replica group's `worker`: the role and bootstrap port its replicas are registered with
    (None: what each replica reports, then the group's name; serving/router_sync.py)."""

    role: str | None = None
    bootstrap_port: int | None = None


class StoredGroup(_Stored):
    name: str = ""
    index: int = 0
    nodes: int = 1
    commands: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)  # masked keys hold the mask (see StoredTask.server)
    image: str | None = None
    ports: tuple[int | str, ...] = ()
    fleets: tuple[str, ...] = ()
    slices: int = 1
    on_slice_failure: str = "whole-set"  # or "replace-slice" (engine/slice_replace.py)
    resources: StoredResources = StoredResources()
    probes: tuple[Probe, ...] = ()  # as the parser checked them; the runner is handed their dump
    ready_timeout: int = 0  # seconds; 0: no limit
    depends_on: tuple[StoredDependency, ...] = ()
    on_failure: tuple[StoredRule, ...] = ()
    max_restarts: int = DEFAULT_MAX_RESTARTS
    # a service's replica group only (a task's groups leave them unset): each replica is `nodes`
    # jobs (1 until multi-host replicas), the range it is kept in, how it scales, and the router
    # it is (`smg`: the group the endpoint sends to, whose worker list the engine keeps)
    replicas: StoredReplicas | None = None
    scaling: StoredScaling | None = None
    router: str | None = None
    worker: StoredWorker | None = None

    @model_validator(mode="before")
    @classmethod
    def _nulls_are_defaults(cls, value: Any) -> Any:
        return _without_nulls(value)


class StoredVolume(_Stored):
    path: str
    instance_path: str | None = None


class StoredRegistryAuth(_Stored):
    username: str | None = None  # the password is the server's (ServerFields.registry_password)


class StoredContainer(_Stored):
    """The container keys that take effect (dialect.CONTAINER_KEYS_IN_EFFECT, besides `image`)."""

    privileged: bool = False
    user: str | None = None
    entrypoint: str | None = None
    working_dir: str | None = None
    shell: str | None = None
    volumes: tuple[StoredVolume, ...] = ()
    registry_auth: StoredRegistryAuth | None = None


class ServerFields(_Stored):
    """What the server adds at submit; none of it is shown as the run's configuration."""

    secret_env: str = ""  # the masked env keys' values, encrypted (muster/crypto.py)
    hidden_env: tuple[str, ...] = ()  # the masked keys' names
    registry_password: str | None = None  # encrypted


class StoredTask(_Stored):
    """`type: task` as stored: the user's checked configuration, and the server's fields."""

    type: Literal["task"] = "task"
    name: str | None = None
    image: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    startup_order: str = "any"
    stop_criteria: str = "all-done"
    retry: StoredRetry | None = None
    max_duration: int | None = None  # seconds; None: no limit
    fleets: tuple[str, ...] = ()
    nodes: int = 0
    groups: tuple[StoredGroup, ...] = ()
    uses_groups: bool = False
    container: StoredContainer = StoredContainer()
    profile: dict[str, Any] = Field(default_factory=dict)
    server: ServerFields = ServerFields()

    @model_validator(mode="before")
    @classmethod
    def _apart(cls, value: Any) -> Any:
        """The stored dict is flat: the server's keys are taken out into `server`."""
        if not isinstance(value, dict):
            return value
        user = {k: v for k, v in _without_nulls(value).items() if k not in SERVER_KEYS}
        user["server"] = {"secret_env": value.get("secret_env") or "", "hidden_env": value.get("hidden_env") or (),
                          "registry_password": value.get("secret_registry_password") or None}
        return user

    def group(self, index: int) -> StoredGroup:
        """Group `index`; a default group for an index the row has no group for (the engine has
        always read such a group as empty)."""
        return self.groups[index] if 0 <= index < len(self.groups) else _NO_GROUP


class StoredRollout(_Stored):
    """A routed service's `rollout`: at most `max_surge` replicas beyond the serving deployment's
    during an update (None: a full second copy of every group)."""

    max_surge: int | None = None


class StoredService(StoredTask):
    """`type: service` as stored: a task's fields (its `groups` are the replica groups, each with
    `replicas`; a service without `groups` is stored with one group), and the endpoint's keys."""

    type: Literal["service"] = "service"
    port: int = 80  # the replicas' port the endpoint sends to
    auth: bool = True
    strip_prefix: bool = True
    model: str | None = None
    https: bool | None = None
    rollout: StoredRollout | None = None

    def replica_group(self, name: str) -> StoredGroup | None:
        return next((g for g in self.groups if g.name == name), None)

    @property
    def routed(self) -> bool:
        """A group is a router: an update is blue/green per deployment (engine/replicas/revisions.py)."""
        return any(g.router for g in self.groups)


def _without_nulls(value: Any) -> Any:
    # the engine has always read a stored key as `value or default`: a stored null is the default
    return {k: v for k, v in value.items() if v is not None} if isinstance(value, dict) else value


_NO_GROUP = StoredGroup()
StoredRun = StoredTask  # StoredService is a StoredTask: what the engine reads of a task, it reads of both
STORED_TYPES: dict[str, type[StoredTask]] = {"task": StoredTask, "service": StoredService}


def stored_run(configuration: dict | None) -> StoredRun:
    """The typed form of a stored configuration dict (its `type` picks the variant)."""
    data = configuration or {}
    return STORED_TYPES[data.get("type") or "task"].model_validate(data)


_CACHE = "_stored_run"


def run_configuration(run: Any) -> StoredRun:
    """The run's stored configuration, typed; built once per Run instance (again only when
    `run.configuration` was replaced, e.g. by refresh_from_db)."""
    configuration = run.configuration
    cached = run.__dict__.get(_CACHE)
    if cached is not None and cached[0] is configuration:
        return cached[1]
    built = stored_run(configuration)
    run.__dict__[_CACHE] = (configuration, built)
    return built
