"""`type: service`: from the written configuration to a checked ServiceConfiguration.

A service is a task whose groups are replica groups: each replica is `nodes` hosts (one unless the
group sets `nodes: N`, a multi-host replica) running the group's commands, kept at `replicas` (a
fixed count, or a range the scaler moves in). So the keys a service
shares with a task (commands, image, env, resources, probes, retry, fleets, container and profile
keys) are read by the task parser, from the document with the service's own keys taken out
(`service_written` reads those), and both sets of problems are raised as one 400.

A service without `groups` is one replica group named `0` (dstack's name for it). A probe without
`port` probes the service's `port`; a service with an OpenAI `model` and no `probes` gets dstack's
default probe (a one-token chat completion), except on the worker groups of a routed service.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

from .errors import ConfigurationError, ErrorList, format_loc
from .fields import CheckedModel, read_model, read_model_partially
from .service_written import (
    GROUP_REFUSED,
    GROUP_SERVICE_KEYS,
    ModelInput,
    ReplicaGroupInput,
    ScalingInput,
    ServiceKeys,
    scaling_problem,
)
from .task import parse_run_configuration
from .task_checked import NodeGroup, TaskConfiguration

DEFAULT_GROUP_NAME = "0"
SERVICE_KEYS = tuple(ServiceKeys.model_fields)
# task keys that mean nothing for a service (dstack's services do not have them either)
REFUSED = {
    "slices": "TPU multislice replicas are not supported yet: set `nodes` for a replica over several hosts",
    "on_slice_failure": "TPU multislice replicas are not supported yet: it is a key of a multislice set",
    "stop_criteria": "a service runs until it is stopped",
    "ports": "a service serves on `port`, which the endpoint sends to (other ports: `muster attach`)",
    "on_failure": "a failed replica is replaced with the run's `retry` policy",
    "max_restarts": "a failed replica is replaced with the run's `retry` policy",
}
OPENAI_PROBE_TIMEOUT = 30  # seconds: a one-token completion of a loaded model
WHY_NO_GATEWAY = ("Muster has no gateways: the service is served by this server's endpoint, at "
                  "<endpoint>/proxy/services/<project>/<run>/ (the URL apply prints)")


class ReplicaRange(CheckedModel):
    min: int
    max: int


class Scaling(CheckedModel):
    metric: Literal["rps", "queue"] = "rps"
    target: float
    window: int
    scale_up_delay: int
    scale_down_delay: int
    queue_metric: str | None = None  # metric: queue only, as the next two
    metrics_port: int | None = None  # None: the service's port
    metrics_path: str | None = None


class Rollout(CheckedModel):
    max_surge: int | None = None  # None: blue/green with a full second copy of every group


class Worker(CheckedModel):
    """`worker`: the role (and a prefill's bootstrap port) the router registers the group's replicas
    with, over what they report (docs/services.md, "PD services")."""

    role: Literal["prefill", "decode", "regular"] | None = None
    bootstrap_port: int | None = None


class ServiceGroup(NodeGroup):
    """A replica group: a task group of `nodes` nodes per replica, with its replica range."""

    replicas: ReplicaRange
    scaling: Scaling | None = None
    router: str | None = None
    worker: Worker | None = None

    @property
    def desired(self) -> int:
        """The replicas a new service starts with: the fixed count, or the range's minimum."""
        return self.replicas.min


class ServiceConfiguration(TaskConfiguration):
    type: Literal["service"] = "service"  # type: ignore[assignment]
    groups: list[ServiceGroup]  # type: ignore[assignment]
    port: int
    auth: bool = True
    strip_prefix: bool = True
    model: str | None = None
    https: bool | None = None  # None: dstack's `auto` / not written
    gateway: bool | str | None = None
    rate_limits: list[dict[str, Any]] = []
    rollout: Rollout | None = None

    def desired_replicas(self) -> dict[str, int]:
        return {g.name: g.desired for g in self.groups}


def parse_service_configuration(document: dict, *, endpoint_tls: bool = False, **kwargs: Any) -> ServiceConfiguration:
    """Check a service; ConfigurationError lists every problem (the service's keys' and the
    task keys'). `endpoint_tls`: whether the endpoint's URL is https (else `https: true` warns)."""
    errors = ErrorList()
    warnings: list[dict[str, Any]] = []
    if isinstance(document.get("replicas"), list) and document.get("groups") is None:
        # dstack's legacy form: the replica groups written under `replicas`
        document = {**{k: v for k, v in document.items() if k != "replicas"}, "groups": document["replicas"]}
    service, bad = read_model_partially(ServiceKeys, {k: v for k, v in document.items() if k in SERVICE_KEYS},
                                        [], errors)
    port = service.port if service is not None and "port" not in bad else None
    groups_written = document.get("groups")
    if document.get("replicas") is not None and groups_written is not None:
        errors.add(["replicas"], "`replicas` and `groups` cannot be used together: set `replicas` in each group")
    if service is not None and groups_written is None and (problem := scaling_problem(service.replicas,
                                                                                        service.scaling)):
        errors.add([problem[0]], problem[1])
    if groups_written is not None and document.get("scaling") is not None:
        errors.add(["scaling"], "top-level `scaling` cannot be used with `groups`: set `scaling` in each group")
    for key, why in REFUSED.items():
        if key in document:
            errors.add([key], f"`{key}` is not a service key: {why}")

    task_doc = {k: v for k, v in document.items() if k not in SERVICE_KEYS and k not in REFUSED}
    task_doc["type"] = "task"
    model = _model(service, errors)
    group_inputs: list[ReplicaGroupInput | None] = []
    copied: dict[int, set[str]] = {}
    if isinstance(groups_written, list):
        task_doc["groups"], group_inputs = [], []
        top_probes = task_doc.pop("probes", None)
        routed = any(isinstance(g, dict) and g.get("router") is not None for g in groups_written)
        for i, raw in enumerate(groups_written):
            group, copied[i] = _group_doc(raw, i, top_probes, document, errors, warnings)
            group_inputs.append(read_model(ReplicaGroupInput, raw, ["groups", i], errors)
                                if isinstance(raw, dict) else None)
            default_probe = _model_probe(model) if model is not None else None
            if isinstance(group, dict) and "probes" not in group and default_probe and (
                    not routed or raw.get("router") is not None):
                group["probes"] = [default_probe]
            task_doc["groups"].append(group)
        _check_groups(group_inputs, document, errors)
    elif groups_written is not None:
        errors.add(["groups"], "expected a list of replica groups")
    elif "probes" not in task_doc and model is not None and _model_probe(model):
        task_doc["probes"] = [_model_probe(model)]
    _probe_ports(task_doc, port)

    task: TaskConfiguration | None = None
    try:
        task = parse_run_configuration(task_doc, **kwargs)
    except ConfigurationError as exc:
        for item in _relocated(exc.errors, copied):
            if item not in errors.items:
                errors.add(item["loc"], item["msg"])
    errors.raise_if_any()
    assert task is not None and service is not None
    _warn_service(service, endpoint_tls, group_inputs, warnings)
    if task.profile.get("preemptible"):  # a replica's stop is the scaler's and the rollout's (engine/replicas/)
        warnings.append({"field": ["preemptible"], "message": "preemptible: has no effect on a service: only tasks "
                         "are preempted (docs/queueing.md)"})
    ranges = [g.range if g is not None else (1, 1) for g in group_inputs] or [service.replicas or (1, 1)]
    scalings = [g.scaling for g in group_inputs] if group_inputs else [service.scaling]
    routers = [g.router.type if g is not None and g.router else None for g in group_inputs] or [None]
    workers = [Worker(**dict(g.worker)) if g is not None and g.worker else None for g in group_inputs] or [None]
    groups = [ServiceGroup(**{**dict(g), "name": g.name if group_inputs else DEFAULT_GROUP_NAME},
                           replicas=ReplicaRange(min=r[0], max=r[1]), scaling=_scaling(s), router=router,
                           worker=worker)
              for g, r, s, router, worker in zip(task.groups, ranges, scalings, routers, workers, strict=True)]
    task_fields = {k: v for k, v in dict(task).items()
                   if k not in ("type", "groups", "nodes", "warnings", "registry_password")}
    return ServiceConfiguration(
        **task_fields, groups=groups, nodes=sum(g.desired * g.nodes for g in groups), port=service.port,
        auth=service.auth, strip_prefix=service.strip_prefix, model=model["name"] if model else None,
        rollout=Rollout(max_surge=service.rollout.max_surge) if service.rollout else None,
        https=service.https if isinstance(service.https, bool) else None, gateway=service.gateway,
        rate_limits=[limit.model_dump() for limit in service.rate_limits],
        warnings=[*task.warnings, *({"field": format_loc(w["field"]), "message": w["message"]} for w in warnings)],
        registry_password=task.registry_password,
    )


def _group_doc(raw: object, index: int, top_probes: object, document: dict, errors: ErrorList,
               warnings: list) -> tuple[object, set[str]]:
    """The replica group as a task group (its service keys taken out), and the keys copied into it
    from the top level (so a problem in them is named where it was written)."""
    if not isinstance(raw, dict):
        return raw, set()
    loc = ["groups", index]
    for key, why in GROUP_REFUSED.items():
        if key in raw:
            errors.add([*loc, key], f"`{key}` is not a replica group key: {why}")
    group = {k: v for k, v in raw.items() if k not in GROUP_SERVICE_KEYS and k not in GROUP_REFUSED}
    copied = set()
    if "probes" not in group and top_probes is not None:
        group["probes"] = top_probes  # dstack's probes are the service's, for every group
        copied.add("probes")
    if raw.get("image") is not None and raw.get("python") is not None:
        errors.add([*loc, "python"], "`image` and `python` cannot be used together within a replica group")
    for key in ("image", "privileged", "python", "nvcc", "docker", "spot_policy", "reservation"):
        if raw.get(key) is not None and document.get(key) not in (None, False):
            errors.add([*loc, key], f"`{key}` is set at the service level and in this group: set it in one "
                       "place only (as dstack requires)")
    if not raw.get("commands") and raw.get("image") is None and document.get("image") is None:
        errors.add([*loc, "commands"], "a replica group needs `commands`, or `image` in the group or at the "
                   "service level")
    notes = {"python": "this server has no default image for a Python version: set image, or the commands run "
                       "with the host's Python",
             "nvcc": "takes effect once jobs run in containers; until then the commands run on the host",
             "docker": "docker-in-docker images are not provided: set image to one with Docker",
             "privileged": "set per replica group, it has no effect yet: set `privileged` at the service level",
             "spot_policy": "has no effect here: spot or on-demand is decided by the fleet",
             "reservation": "has no effect here: Muster has no cloud reservations"}
    for key, note in notes.items():
        if raw.get(key) not in (None, False):
            warnings.append({"field": [*loc, key], "message": f"{key}: {note}"})
    return group, copied


def _check_groups(groups: list[ReplicaGroupInput | None], document: dict, errors: ErrorList) -> None:
    if not groups and isinstance(document.get("groups"), list):
        errors.add(["groups"], "`groups` must list at least one replica group")
    routers = [i for i, g in enumerate(groups) if g is not None and g.router is not None]
    for i, group in enumerate(groups):
        for key, problem in group.problems() if group is not None else ():
            errors.add(["groups", i, key], problem)
    for i in routers[1:]:
        errors.add(["groups", i, "router"], "at most one replica group may have `router`")
    for i in routers:
        if groups[i].worker is not None:  # type: ignore[union-attr]
            errors.add(["groups", i, "worker"], "the router group is no worker: set `worker` on the groups the "
                       "router sends to, or remove it")
    for i in routers[:1]:
        if groups[i].range != (1, 1):  # type: ignore[union-attr]
            errors.add(["groups", i, "replicas"], "the replica group with `router` must have replicas: 1 "
                       "(as in dstack 0.22)")
        written = document["groups"][i].get("nodes")
        if written not in (None, 1):
            # the router is a CPU process the endpoint sends to: nothing of it spans hosts
            errors.add(["groups", i, "nodes"], "the replica group with `router` is one host per replica: remove "
                       "`nodes` (set `nodes` on the worker groups)")


def _relocated(items: list[dict], copied: dict[int, set[str]]) -> list[dict]:
    """A problem in a key copied from the top level into a group is named at the top level."""
    out = []
    for item in items:
        loc = item["loc"]
        if len(loc) >= 3 and loc[0] == "groups" and isinstance(loc[1], int) and loc[2] in copied.get(loc[1], ()):
            item = {"loc": loc[2:], "msg": item["msg"]}
        if item not in out:
            out.append(item)
    return out


def _probe_ports(task_doc: dict, port: int | None) -> None:
    """A probe without `port` probes the service's port (dstack's service probes have no port)."""
    if port is None:
        return

    def fill(probes: object) -> object:
        if not isinstance(probes, list):
            return probes
        return [{**p, "port": port} if isinstance(p, dict) and "port" not in p and p.get("type") != "exec" else p
                for p in probes]

    if "probes" in task_doc:
        task_doc["probes"] = fill(task_doc["probes"])
    for group in task_doc.get("groups") or []:
        if isinstance(group, dict) and "probes" in group:
            group["probes"] = fill(group["probes"])


def _model(service: ServiceKeys | None, errors: ErrorList) -> dict[str, str] | None:
    if service is None or service.model is None:
        return None
    if isinstance(service.model, str):
        return {"name": service.model, "format": "openai", "prefix": "/v1"}
    found = read_model(ModelInput, service.model, ["model"], errors)
    return None if found is None else {"name": found.name, "format": found.format, "prefix": found.prefix}


def _model_probe(model: Mapping[str, str]) -> dict[str, Any] | None:
    """dstack's default probe of a service with an OpenAI model: a one-token chat completion."""
    if model["format"] != "openai":
        return None
    body = json.dumps({"model": model["name"], "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
    return {"type": "http", "method": "post", "url": model["prefix"].rstrip("/") + "/chat/completions",
            "headers": [{"name": "Content-Type", "value": "application/json"}], "body": body,
            "timeout": OPENAI_PROBE_TIMEOUT}


def _scaling(scaling: ScalingInput | None) -> Scaling | None:
    if scaling is None:
        return None
    queue = scaling.metric == "queue"
    return Scaling(metric=scaling.metric, target=scaling.target, window=scaling.window or 60,
                   scale_up_delay=scaling.scale_up_delay, scale_down_delay=scaling.scale_down_delay,
                   queue_metric=scaling.queue_metric, metrics_port=scaling.metrics_port,
                   metrics_path=(scaling.metrics_path or "/metrics") if queue else None)


def _warn_service(service: ServiceKeys, endpoint_tls: bool, groups: list, warnings: list) -> None:
    def warn(field: list, message: str) -> None:
        warnings.append({"field": field, "message": message})

    if service.gateway not in (None, False):
        warn(["gateway"], f"gateway: {service.gateway} — {WHY_NO_GATEWAY}")
    if service.https is True and not endpoint_tls:
        warn(["https"], "https: true — this server's endpoint is plain HTTP (MUSTER_ENDPOINT_URL is http://): put "
             "a TLS proxy in front of it and set MUSTER_ENDPOINT_URL to its https:// URL")
    if service.rate_limits:
        warn(["rate_limits"], "rate_limits: not enforced: Muster's endpoint has no rate limiting yet (put it in "
             "the TLS proxy in front of the endpoint)")
    if service.model is not None:
        warn(["model"], "model: Muster serves no OpenAI-compatible /proxy/models/ endpoint (dstack deprecates it): "
             "use the service URL, e.g. <service URL>v1/chat/completions")
    if service.rollout is not None and not any(g is not None and g.router is not None for g in groups):
        warn(["rollout"], "rollout: applies to a service with a `router` group (blue/green updates); this one's "
             "updates roll replica by replica with a surge of one")
    for i, group in enumerate(groups):
        # smg's worker list is kept by the engine (serving/router_sync.py); another router's is not
        if group is not None and group.router is not None and group.router.type != "smg":
            warn(["groups", i, "router"], f"router: {group.router.type} — Muster keeps only smg's worker list: the "
                 "endpoint sends to this group's replicas, and this router must find its workers itself")
