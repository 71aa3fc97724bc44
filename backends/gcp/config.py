"""Where a gcp fleet's settings come from, lowest priority first.

1. `MUSTER_GCP_*` environment variables (a container or systemd unit sets these);
2. `settings.MUSTER["GCP"]` (a settings file, or tests);
3. what the fleet configuration says at the top level: `zones`, `spot`, `runtime_version`,
   `queued_resource` and `reservation`;
4. the fleet configuration's `gcp` mapping, when present (set by code, not by the YAML parser).

The result feeds both `TpuConfig.from_dict` (the API side) and the instances app (`ssh_user`,
`ssh_private_key`: how the server logs in to the TPU hosts).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from backends.base import BackendError

# environment variable -> key; zones are comma separated, credentials are JSON text or a file path.
ENV_KEYS = {
    "MUSTER_GCP_PROJECT_ID": "project_id",
    "MUSTER_GCP_ZONES": "zones",
    "MUSTER_GCP_API_ENDPOINT": "api_endpoint",
    "MUSTER_GCP_TRANSPORT": "transport",
    "MUSTER_GCP_NETWORK": "network",
    "MUSTER_GCP_CREDENTIALS": "credentials",
    "MUSTER_GCP_SSH_USER": "ssh_user",
    "MUSTER_GCP_SSH_PRIVATE_KEY": "ssh_private_key",
    "MUSTER_GCP_TIMEOUT": "timeout",
}


def env_settings(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    environ = os.environ if environ is None else environ
    out: dict[str, Any] = {}
    for var, key in ENV_KEYS.items():
        value = environ.get(var, "").strip()
        if not value:
            continue
        if key == "zones":
            out[key] = [z.strip() for z in value.split(",") if z.strip()]
        elif key in ("credentials", "ssh_private_key") and not value.startswith(("{", "-----")):
            out[key] = _read_file(value)  # a path: keys do not fit comfortably in an env var
        else:
            out[key] = value
    return out


def _read_file(path: str) -> str:
    try:
        with open(os.path.expanduser(path), encoding="utf-8") as f:
            return f.read()
    except OSError as exc:
        raise BackendError(f"gcp backend: cannot read {path}: {exc}") from exc


def fleet_settings(configuration: Mapping[str, Any]) -> dict[str, Any]:
    """The keys a `type: fleet` configuration with `backends: [gcp]` contributes."""
    out: dict[str, Any] = {}
    if configuration.get("zones"):
        out["zones"] = list(configuration["zones"])
    if "spot" in configuration:
        out["spot"] = bool(configuration["spot"])
    if configuration.get("runtime_version"):
        out["runtime_version"] = configuration["runtime_version"]
    if configuration.get("queued_resource") is not None:
        out["queued_resource"] = dict(configuration["queued_resource"])
        if configuration.get("reservation"):
            out["reservation"] = configuration["reservation"]
    return out


def merged(server: Mapping[str, Any] | None, configuration: Mapping[str, Any]) -> dict[str, Any]:
    return {
        **env_settings(),
        **dict(server or {}),
        **fleet_settings(configuration),
        **dict(configuration.get("gcp") or {}),
    }


# keys of a fleet's `gcp` mapping that a group never keeps on its row (engine/pods.py)
SECRET_KEYS = ("credentials", "ssh_private_key")


def kept_settings(configuration: Mapping[str, Any]) -> dict[str, Any]:
    """The fleet's own keys (3. and 4. above) without secrets: what its groups keep, so that the
    delete of a slice still finds it (zones, queued or not) once the fleet's row is gone."""
    own = {k: v for k, v in dict(configuration.get("gcp") or {}).items() if k not in SECRET_KEYS}
    return {**fleet_settings(configuration), **own}


def with_kept(server: Mapping[str, Any] | None, kept: Mapping[str, Any]) -> dict[str, Any]:
    """A group's settings when its fleet is gone: the server's, then what the group kept."""
    return {**env_settings(), **dict(server or {}), **{k: v for k, v in kept.items() if k not in SECRET_KEYS}}
