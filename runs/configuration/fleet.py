"""`type: fleet`: SSH fleets (hosts you have) and cloud fleets (instances Muster creates)."""

from __future__ import annotations

import base64
import binascii
import struct
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .dialect import SpotPolicy, TerminationPolicy, check_backends, check_max_price
from .documents import load_document
from .durations import parse_duration, parse_optional_duration
from .envs import parse_env
from .errors import ConfigurationError, ErrorList, format_loc
from .fields import WrittenModel, check_slug, read_model_partially
from .ranges import parse_count_range
from .resources import IntRange, Resources, Warnings, parse_resources

DEFAULT_SSH_PORT = 22
# How long an idle cloud instance (a whole TPU pod) is kept before it is deleted.
DEFAULT_IDLE_DURATION = 72 * 3600
# Keys that describe instances to create; an SSH fleet is exactly its hosts.
CLOUD_KEYS = ("nodes", "resources", "spot", "zones", "regions", "idle_duration", "runtime_version")

Placement = Literal["any", "cluster"]
Backend = Literal["gcp", "local"]


# ---- the written form -------------------------------------------------------------------------


class _HostInput(WrittenModel):
    hostname: str
    port: int | None = None
    user: str | None = None
    identity_file: str | None = None
    private_key: str | None = None
    host_key: str | None = None

    @field_validator("hostname")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("hostname cannot be empty")
        return value.strip()

    @field_validator("port")
    @classmethod
    def _port(cls, value: int | None) -> int | None:
        return _check_ssh_port(value)


class _SSHInput(WrittenModel):
    user: str | None = None
    identity_file: str | None = None
    private_key: str | None = None
    port: int | None = None
    hosts: list[_HostInput]

    @field_validator("hosts", mode="before")
    @classmethod
    def _bare_hostnames(cls, value: object) -> object:
        # `- 10.0.0.5` is shorthand for `- hostname: 10.0.0.5`.
        if isinstance(value, list):
            return [{"hostname": item} if isinstance(item, str) else item for item in value]
        return value

    @field_validator("hosts")
    @classmethod
    def _some_hosts(cls, value: list[_HostInput]) -> list[_HostInput]:
        if not value:
            raise ValueError("list at least one host")
        return value

    @field_validator("port")
    @classmethod
    def _port(cls, value: int | None) -> int | None:
        return _check_ssh_port(value)


class _FleetInput(WrittenModel):
    type: Literal["fleet"] = "fleet"
    name: str | None = None  # required by Muster (dstack generates one); checked below
    placement: Placement = "any"
    ssh_config: _SSHInput | None = None
    backends: list[str] | None = None
    nodes: Any = None
    resources: Any = None
    spot: bool = False
    zones: list[str] = []
    regions: list[str] = []
    idle_duration: Any = None
    runtime_version: str | None = None
    # dstack's other fleet keys: read with its types; each written one takes effect or warns
    env: Any = None
    spot_policy: SpotPolicy | None = None
    availability_zones: list[str] | None = None
    instance_types: list[str] | None = None
    reservation: str | None = None
    blocks: Any = None
    retry: Any = None
    max_price: float | None = None
    stop_duration: Any = None
    termination_policy: TerminationPolicy | None = None
    termination_idle_time: Any = None
    tags: dict[str, str] | None = None

    @field_validator("name")
    @classmethod
    def _slug(cls, value: str | None) -> str | None:
        check_slug(value)
        return value

    @field_validator("backends")
    @classmethod
    def _some_backends(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and not value:
            raise ValueError("list at least one backend (gcp or local)")
        value = check_backends(value)
        if value is not None and any(b in ("ssh", "remote") for b in value):
            raise ValueError("an ssh fleet is written with `ssh_config` (its hosts), not `backends`")
        return value

    @field_validator("blocks")
    @classmethod
    def _blocks(cls, value: object) -> object:
        if value is None or value == "auto" or (type(value) is int and value >= 1):
            return value
        raise ValueError("blocks must be `auto` or a whole number of at least 1")

    @field_validator("retry")
    @classmethod
    def _retry(cls, value: object) -> object:
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, dict) and set(value) <= {"on_events", "duration"}:
            if value.get("duration") is not None:
                parse_duration(value["duration"])
            return value
        raise ValueError("retry must be true, false or a mapping with on_events and duration")

    @field_validator("max_price")
    @classmethod
    def _price(cls, value: float | None) -> float | None:
        return check_max_price(value)

    @field_validator("stop_duration", "termination_idle_time")
    @classmethod
    def _other_durations(cls, value: object) -> object:
        return None if value is None or value is True else parse_optional_duration(value)

    @field_validator("nodes")
    @classmethod
    def _nodes(cls, value: object) -> tuple[int | None, int | None] | None:
        return None if value is None else parse_count_range(value, "nodes")

    @field_validator("idle_duration")
    @classmethod
    def _idle(cls, value: object) -> object:
        return None if value is None else parse_optional_duration(value)


def _check_ssh_port(value: int | None) -> int | None:
    if value is not None and not 1 <= value <= 65535:
        raise ValueError(f"port {value} is out of range (1..65535)")
    return value


# ---- the checked form -------------------------------------------------------------------------


class _Checked(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SSHHost(_Checked):
    """One host with the fleet-level defaults already applied."""

    hostname: str
    port: int
    user: str
    identity_file: str | None
    private_key: str | None = Field(default=None, repr=False)  # key content: never in logs
    host_key: str | None = None  # "<keytype> <base64>": the key the host must present


class SSHConfig(_Checked):
    hosts: list[SSHHost]


class FleetConfiguration(_Checked):
    type: Literal["fleet"] = "fleet"
    name: str
    placement: Placement
    ssh_config: SSHConfig | None
    backends: list[Backend] | None
    nodes: IntRange | None  # cloud fleets: how many instances
    resources: Resources | None  # cloud fleets
    spot: bool
    zones: list[str]
    regions: list[str]
    idle_duration: int | None  # seconds; None = kept until deleted (`off`)
    runtime_version: str | None
    spot_policy: SpotPolicy | None = None  # as written; `spot` is what it means for gcp
    # what the written configuration asks for that does not take effect here (not stored)
    warnings: list[dict[str, str]] = Field(default_factory=list, exclude=True)


# ---- parsing ----------------------------------------------------------------------------------


_FLEET_NOTES = {
    "env": "the fleet's env is not passed to jobs: set env on the task",
    "regions": "gcp fleets try the zones listed in `zones`; regions are kept but not used",
    "availability_zones": "write the gcp zones to try as `zones`",
    "instance_types": "TPU slices are chosen by `resources.gpu`",
    "reservation": "Muster has no cloud reservations",
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

    ssh_config = _check_ssh(fleet, errors) if fleet.ssh_config is not None else None
    nodes: IntRange | None = None
    idle_duration: int | None = None
    spot = fleet.spot
    if fleet.ssh_config is not None:
        for key in CLOUD_KEYS:
            if key in fleet.model_fields_set:
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
                errors.add(["spot_policy"], f"spot_policy: {fleet.spot_policy} contradicts spot: "
                           f"{str(fleet.spot).lower()}: write one of them")
            spot = fleet.spot_policy == "spot"
            if fleet.spot_policy == "auto":
                warnings.append({"field": ["spot_policy"], "message": (
                    "spot_policy: auto creates on-demand capacity here: Muster does not fall back "
                    "between spot and on-demand; write spot to ask for spot capacity")})
            if "local" in fleet.backends and fleet.spot_policy != "on-demand":
                warnings.append({"field": ["spot_policy"], "message": (
                    f"spot_policy: {fleet.spot_policy} ignored on a local fleet: its instances are this machine")})
    for key, note in _FLEET_NOTES.items():
        if key in fleet.model_fields_set and getattr(fleet, key) not in (None, []):
            warnings.append({"field": [key], "message": f"{key}: has no effect here: {note}"})
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
        warnings=[{"field": format_loc(w["field"]), "message": w["message"]} for w in warnings],
    )


def _check_ssh(fleet: _FleetInput, errors: ErrorList) -> SSHConfig:
    ssh = fleet.ssh_config
    assert ssh is not None
    hosts: list[SSHHost] = []
    seen: dict[tuple[str, int], int] = {}
    for i, host in enumerate(ssh.hosts):
        loc: list[str | int] = ["ssh_config", "hosts", i]
        port = host.port or ssh.port or DEFAULT_SSH_PORT
        key = (host.hostname.lower(), port)
        if key in seen:
            errors.add(loc, f"host `{host.hostname}` (port {port}) is listed twice (also hosts[{seen[key]}])")
            continue
        seen[key] = i
        user = host.user or ssh.user
        private_key = host.private_key or ssh.private_key
        identity_file = host.identity_file or ssh.identity_file
        if not user:
            errors.add(loc, f"no user for host `{host.hostname}`: set ssh_config.user or the host's user")
        if not private_key and not identity_file:
            errors.add(
                loc,
                f"no key for host `{host.hostname}`: set ssh_config.private_key "
                "(or identity_file) or the host's own",
            )
        host_key = None
        if host.host_key is not None:
            try:
                host_key = parse_host_key_line(host.host_key)
            except ValueError as exc:
                errors.add([*loc, "host_key"], f"host `{host.hostname}`: {exc}")
                continue
        if user and (private_key or identity_file):
            hosts.append(
                SSHHost(
                    hostname=host.hostname,
                    port=port,
                    user=user,
                    identity_file=identity_file,
                    private_key=private_key,
                    host_key=host_key,
                )
            )
    return SSHConfig(hosts=hosts)


HOST_KEY_TYPES = (
    "ssh-ed25519", "ssh-rsa", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521",
)


def parse_host_key_line(text: str) -> str:
    """An OpenSSH known_hosts line (`[host]:port ssh-ed25519 AAAA... comment`) or `ssh-ed25519 AAAA...`,
    as "<keytype> <base64>". The key blob must decode and name the same type it is written with."""
    words = text.split()
    for i, word in enumerate(words):
        if word in HOST_KEY_TYPES:
            if i + 1 >= len(words):
                break
            blob_text = words[i + 1]
            try:
                blob = base64.b64decode(blob_text, validate=True)
                (length,) = struct.unpack(">I", blob[:4])
                named = blob[4 : 4 + length].decode("ascii")
            except (binascii.Error, struct.error, UnicodeDecodeError) as exc:
                raise ValueError(f"host_key: the key after {word} is not valid base64 key data") from exc
            if named != word:
                raise ValueError(f"host_key: the key data is a {named or 'unknown'} key, not {word}")
            return f"{word} {blob_text}"
    raise ValueError(
        "host_key must be an OpenSSH known_hosts line or `<keytype> <base64>` (as in the host's "
        f"/etc/ssh/ssh_host_ed25519_key.pub), with keytype one of {', '.join(HOST_KEY_TYPES)}"
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
