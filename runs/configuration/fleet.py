"""`type: fleet`: SSH fleets (hosts you have) and cloud fleets (instances Muster creates).

The checked FleetConfiguration and the rules that span keys: which kind of fleet it is, what a
cloud fleet creates, and a note for each dstack key that has no effect here. The written form is
in `fleet_written`, an SSH fleet's host rules in `fleet_hosts`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from backends.registry import compute_class, fleet_backend

from .container_policy import default_allow_privileged
from .dialect import SpotPolicy
from .documents import load_document
from .envs import parse_env
from .errors import ConfigurationError, ErrorList, format_loc
from .fields import CheckedModel, read_model_partially
from .fleet_hosts import SSHConfig, check_ssh_hosts
from .fleet_shares import Amount, SharedWith, parse_shares
from .fleet_written import Placement, _FleetInput
from .requirements import IntRange, Resources
from .resources import Warnings, parse_resources

# How long an idle cloud instance (a whole TPU pod) is kept before it is deleted.
DEFAULT_IDLE_DURATION = 72 * 3600
# Keys that describe instances to create; an SSH fleet is exactly its hosts.
CLOUD_KEYS = ("nodes", "resources", "spot", "zones", "regions", "idle_duration", "runtime_version",
              "queued_resource")

class VolumePolicy(CheckedModel):
    allowed_prefixes: list[str] = []  # host paths a run's volumes may mount; none by default


class FleetConfiguration(CheckedModel):
    type: Literal["fleet"] = "fleet"
    name: str
    placement: Placement
    ssh_config: SSHConfig | None
    backends: list[str] | None  # backend names (backends/registry.py), checked as written
    nodes: IntRange | None  # cloud fleets: how many instances
    resources: Resources | None  # cloud fleets
    spot: bool
    zones: list[str]
    regions: list[str]
    idle_duration: int | None  # seconds; None = kept until deleted (`off`)
    runtime_version: str | None
    spot_policy: SpotPolicy | None = None  # as written; `spot` is what it means for gcp
    allow_privileged: bool = False  # whether runs' containers may be privileged (gcp: true by default)
    volumes: VolumePolicy = VolumePolicy()
    # gcp: {valid_until: seconds or None[, provisioning_model: flex-start, max_run_duration: seconds]}
    queued_resource: dict[str, Any] | None = None
    reservation: str | None = None  # gcp with queued_resource: the QueuedResource's reservation_name
    # sharing (fleet_shares): the owner's quota and borrowing limit, and each other project's share
    quota: Amount | None = None
    borrowing_limit: Amount | None = None
    shared_with: list[SharedWith] = []
    # what the written configuration asks for that does not take effect here (not stored)
    warnings: list[dict[str, str]] = Field(default_factory=list, exclude=True)


_FLEET_NOTES = {
    "env": "the fleet's env is not passed to jobs: set env on the task",
    "regions": "gcp fleets try the zones listed in `zones`; regions are kept but not used",
    "availability_zones": "write the gcp zones to try as `zones`",
    "instance_types": "TPU slices are chosen by `resources.gpu`",
    "reservation": "a reservation is used by a gcp fleet with queued_resource only",
    "blocks": "a host is not shared between runs",
    "retry": "a gcp fleet creates slices when a run needs them; the run's own `retry` applies",
    "max_price": "Muster does not know instance prices",
    "stop_duration": "stopping a fleet's hosts has Muster's fixed grace period",
    "termination_policy": "deprecated by dstack: use `idle_duration`",
    "termination_idle_time": "deprecated by dstack: use `idle_duration`",
    "tags": "TPU slices get no tags",
}


def parse_fleet_configuration(data: str | dict) -> FleetConfiguration:
    """Check a fleet configuration and return it normalized; ConfigurationError lists every problem."""
    document = load_document(data)
    errors = ErrorList()
    warnings: Warnings = []
    fleet, bad = read_model_partially(_FleetInput, document, [], errors)
    if fleet is None:
        fleet = _FleetInput.model_validate({})
        bad = {str(k) for k in document}
    if fleet.name is None and "name" not in bad:
        errors.add(["name"], "`name` is required")
    parse_env(fleet.env, errors, ["env"])
    resources = None
    if document.get("resources") is not None:
        try:
            resources = parse_resources(document.get("resources"))
        except ConfigurationError as exc:
            errors.extend_from(exc, ["resources"])

    if fleet.ssh_config is not None and fleet.backends is not None:
        errors.add(
            ["backends"],
            "`ssh_config` and `backends` cannot be used together: a fleet is either "
            "hosts you have (ssh_config) or instances to create (backends)",
        )
    elif fleet.ssh_config is None and fleet.backends is None and not {"ssh_config", "backends"} & bad:
        errors.add(["ssh_config"], "set `ssh_config` (hosts you have) or `backends` (instances to create)")

    ssh_config = check_ssh_hosts(fleet, errors) if fleet.ssh_config is not None else None
    nodes: IntRange | None = None
    idle_duration: int | None = None
    spot = fleet.spot
    if fleet.ssh_config is not None:
        for key in CLOUD_KEYS:
            if key == "queued_resource" and key in fleet.model_fields_set:
                errors.add([key], "`queued_resource` is for gcp fleets (`backends: [gcp]`), which request TPU "
                           "slices; an SSH fleet is just its hosts: remove it")
            elif key in fleet.model_fields_set:
                errors.add([key], f"`{key}` is for cloud fleets (`backends`); an ssh fleet is just its hosts")
        if fleet.spot_policy is not None:
            warnings.append({"field": ["spot_policy"], "message": (
                f"spot_policy: {fleet.spot_policy} ignored on an SSH fleet: its hosts are what they are")})
    elif fleet.backends is not None:
        if resources is None and "resources" not in bad:
            resources = parse_resources(None)
        if resources is not None:
            nodes = _cloud_nodes(fleet.nodes, resources, errors)
        idle_duration = (
            fleet.idle_duration if "idle_duration" in fleet.model_fields_set else DEFAULT_IDLE_DURATION
        )
        if fleet.spot_policy is not None:
            if "spot" in fleet.model_fields_set and fleet.spot != (fleet.spot_policy == "spot"):
                errors.add(["spot_policy"], f"`spot_policy: {fleet.spot_policy}` contradicts "
                           f"`spot: {str(fleet.spot).lower()}`: write one of them")
            spot = fleet.spot_policy == "spot"
            if fleet.spot_policy == "auto":
                warnings.append({"field": ["spot_policy"], "message": (
                    "spot_policy: auto creates on-demand capacity here: Muster does not fall back "
                    "between spot and on-demand; write spot to ask for spot capacity")})
            for name in fleet.backends:
                note = compute_class(fleet_backend([name])).spot_note
                if note and fleet.spot_policy != "on-demand":
                    warnings.append({"field": ["spot_policy"], "message": (
                        f"spot_policy: {fleet.spot_policy} ignored on a {name} fleet: {note}")})
    backend = fleet_backend(fleet.backends, given_hosts=fleet.ssh_config is not None)
    allow_privileged = default_allow_privileged(backend) if fleet.allow_privileged is None else fleet.allow_privileged
    if default_allow_privileged(backend) and fleet.allow_privileged is False:
        errors.add(["allow_privileged"], "a gcp fleet's containers run privileged: the TPU runtime opens the "
                   "chips' devices directly; leave allow_privileged out (true) or remove `image` from its runs")
    queued_ok = fleet.backends is not None and any(
        "queued_resource" in compute_class(fleet_backend([name])).own_fleet_keys for name in fleet.backends)
    queued = queued_ok and fleet.queued_resource is not None
    if fleet.queued_resource is not None and fleet.backends is not None and not queued_ok:
        errors.add(["queued_resource"], "queued_resource is for gcp fleets (backends: [gcp]): remove it here")
    if queued and (fleet.queued_resource or {}).get("provisioning_model") and spot:
        errors.add(["queued_resource", "provisioning_model"], "flex-start is not spot: a flex-start slice is "
                   "not preempted during its max_run_duration; remove spot_policy: spot (or spot: true) from this "
                   "fleet, or remove provisioning_model for a spot queued resource")
    for key, note in _FLEET_NOTES.items():
        if key == "reservation" and queued:
            continue  # it takes effect: the queued resource asks for it
        if key in fleet.model_fields_set and getattr(fleet, key) not in (None, []):
            warnings.append({"field": [key], "message": f"{key}: has no effect here: {note}"})
    hosts = len(fleet.ssh_config.hosts) if fleet.ssh_config is not None else None
    shares = parse_shares({k: getattr(fleet, k) for k in ("quota", "borrowing_limit", "shared_with")}, hosts, errors)
    errors.raise_if_any()
    assert fleet.name is not None
    return FleetConfiguration(
        name=fleet.name,
        placement=fleet.placement,
        ssh_config=ssh_config,
        backends=fleet.backends,  # type: ignore[arg-type]
        nodes=nodes,
        resources=resources if fleet.backends is not None else None,
        spot=spot,
        zones=fleet.zones,
        regions=fleet.regions,
        idle_duration=idle_duration,
        runtime_version=fleet.runtime_version,
        spot_policy=fleet.spot_policy,
        allow_privileged=allow_privileged,
        volumes=VolumePolicy(allowed_prefixes=list(dict.fromkeys(fleet.volumes.allowed_prefixes)) if fleet.volumes else []),
        queued_resource=fleet.queued_resource if queued else None,
        reservation=fleet.reservation if queued else None,
        **shares,
        warnings=[{"field": format_loc(w["field"]), "message": w["message"]} for w in warnings],
    )


def _cloud_nodes(
    written: tuple[int | None, int | None] | None, resources: Resources, errors: ErrorList
) -> IntRange:
    """Instances to create; a TPU slice comes as whole slices, so its host count is the unit."""
    shape = resources.gpu.tpu_shape() if resources.gpu is not None else None
    if shape is None:
        low, high = written if written is not None else (1, 1)
        return IntRange(min=low, max=high)
    if written is None:
        return IntRange(min=shape.hosts, max=shape.hosts)
    for bound in written:
        if bound is not None and bound % shape.hosts:
            errors.add(
                ["nodes"],
                f"{shape.name} has {shape.hosts} hosts: nodes must be a multiple of "
                f"{shape.hosts} (one node per host of each slice)",
            )
            break
    return IntRange(min=written[0], max=written[1])
