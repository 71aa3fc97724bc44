"""How the server reaches the TPU API: its settings (`TpuConfig`), the client, and node names.

One TPU node is one pod slice. Building the client is kept apart from the calls made with it
because it is where credentials are resolved (a key, anonymous against a local fake, or
Application Default Credentials), which listing offers never needs. Every call made with the
client is bounded by `TpuConfig.timeout`: the generated client has no default timeout.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from google.api_core.client_options import ClientOptions
from google.cloud import tpu_v2

from backends.base import BackendError
from backends.gcp.tpu_shapes import FAMILIES

CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"

def _default_runtime_versions() -> dict[str, str]:
    return {name: fam.default_runtime_version for name, fam in FAMILIES.items()}


@dataclass
class TpuConfig:
    project_id: str
    zones: list[str]
    # A service-account key (dict, or its JSON text). None: anonymous against a custom endpoint
    # (the loopback fake), Application Default Credentials against Google.
    credentials: dict[str, Any] | str | None = None
    api_endpoint: str | None = None
    transport: str = "rest"
    network: str = "default"
    runtime_versions: dict[str, str] = field(default_factory=_default_runtime_versions)
    spot: bool = False
    timeout: float = 30.0
    # Request slices as queued resources (`queued_resource` on the fleet); `valid_until` in
    # seconds per zone (None: Google's default), `reservation` a name or a full reservation path.
    queued: bool = False
    valid_until: int | None = None
    reservation: str = ""
    # Flex-start (`queued_resource: {provisioning_model: flex-start, max_run_duration}`): how long,
    # in seconds, the slice is ours once given; None: not flex-start.
    max_run_duration: int | None = None

    def __post_init__(self) -> None:
        if not self.project_id:
            raise BackendError("gcp backend: project_id is required")
        if not self.zones:
            raise BackendError("gcp backend: at least one zone is required")
        if self.transport not in ("rest", "grpc"):
            raise BackendError(f"gcp backend: transport must be 'rest' or 'grpc', not {self.transport!r}")
        # A partial override keeps the defaults for the other families.
        self.runtime_versions = {**_default_runtime_versions(), **(self.runtime_versions or {})}

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> TpuConfig:
        zones = config.get("zones") or []
        runtime_versions = dict(config.get("runtime_versions") or {})
        if config.get("runtime_version"):
            # A fleet names one image; a fleet is used for one family, so it applies to all of them.
            runtime_versions = {name: config["runtime_version"] for name in FAMILIES}
        return cls(
            project_id=config.get("project_id", ""),
            zones=[zones] if isinstance(zones, str) else list(zones),
            credentials=config.get("credentials"),
            api_endpoint=config.get("api_endpoint") or None,
            transport=config.get("transport") or "rest",
            network=config.get("network") or "default",
            runtime_versions=runtime_versions,
            spot=bool(config.get("spot", False)),
            timeout=float(config.get("timeout") or 30.0),
            queued=config.get("queued_resource") is not None,
            valid_until=(config.get("queued_resource") or {}).get("valid_until"),
            reservation=config.get("reservation") or "",
            max_run_duration=(config.get("queued_resource") or {}).get("max_run_duration"),
        )


def node_name(cfg: TpuConfig, zone: str, node_id: str) -> str:
    return f"projects/{cfg.project_id}/locations/{zone}/nodes/{node_id}"


def slice_node_id(pod: str, index: int) -> str:
    """Slice `index` of a multislice set: the name a queued resource's multislice_params gives
    (`<node_id_prefix>-<index>`), used for separately created sets too."""
    return f"{pod}-s-{index}"


def replacement_node_id(pod: str, index: int, attempt: int) -> str:
    """A new node for slice `index` (replace-slice): another id than the lost one's, whose delete may
    still be under way (the same id would be ALREADY_EXISTS and adopt the dying node), and as
    long as `slice_node_id`: the pod's 6 hex digits give way to 6 of this replacement's."""
    digest = hashlib.sha256(f"{pod}/{index}/{attempt}".encode()).hexdigest()[:6]
    return f"{pod[:-6]}{digest}-s-{index}"


def member_node_id(pod: str, index: int, member: dict[str, Any] | None) -> str:
    """Slice `index`'s node id: its replacement's when it was replaced, else `slice_node_id`."""
    return (member or {}).get("node_id") or slice_node_id(pod, index)


def queued_name(cfg: TpuConfig, zone: str, qr_id: str) -> str:
    return f"projects/{cfg.project_id}/locations/{zone}/queuedResources/{qr_id}"


def zone_of(name: str) -> str:
    m = re.match(r"^projects/[^/]+/locations/([^/]+)/(?:nodes|queuedResources)/[^/]+$", name)
    if not m:
        raise BackendError(f"not a TPU node name: {name!r}")
    return m.group(1)


def make_client(cfg: TpuConfig) -> tpu_v2.TpuClient:
    credentials = _credentials(cfg)
    if cfg.transport == "grpc" and cfg.api_endpoint and cfg.api_endpoint.startswith("http://"):
        # A plain-text endpoint (a local fake) needs an insecure channel; client_options cannot say so.
        import grpc
        from google.cloud.tpu_v2.services.tpu.transports import TpuGrpcTransport

        channel = grpc.insecure_channel(cfg.api_endpoint.removeprefix("http://"))
        return tpu_v2.TpuClient(transport=TpuGrpcTransport(channel=channel))
    options = ClientOptions(api_endpoint=cfg.api_endpoint) if cfg.api_endpoint else None
    return tpu_v2.TpuClient(credentials=credentials, transport=cfg.transport, client_options=options)


def _credentials(cfg: TpuConfig) -> Any:
    info = cfg.credentials
    if isinstance(info, str) and info.strip():
        try:
            info = json.loads(info)
        except ValueError as exc:
            raise BackendError(f"gcp backend: credentials are not valid JSON: {exc}") from exc
    if info:
        from google.oauth2 import service_account

        return service_account.Credentials.from_service_account_info(info, scopes=[CLOUD_PLATFORM_SCOPE])
    if cfg.api_endpoint:
        from google.auth.credentials import AnonymousCredentials

        return AnonymousCredentials()
    import google.auth
    import google.auth.exceptions

    try:
        credentials, _ = google.auth.default(scopes=[CLOUD_PLATFORM_SCOPE])
    except google.auth.exceptions.DefaultCredentialsError as exc:
        raise BackendError(f"gcp backend: no credentials configured and none found: {exc}") from exc
    return credentials


