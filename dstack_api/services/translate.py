"""dstack's pre-parsed specs -> the configuration Muster plans.

The client parses the YAML with dstack's own models and sends a dump of every key, unset ones as
null/[]/{}, and with its own resource defaults filled in (`cpu: 2..`, `memory: 8GB..`,
`disk: 100GB..`, `gpu: 0..`). Those defaults are not what the user wrote: passed on, they would
make every small host ineligible. So a value equal to the client's default is dropped and Muster's
own defaults apply; a user who writes exactly `memory: 8GB..` loses nothing, since the defaults are
lower bounds. What is left goes to Muster's parser as a YAML would, so a key Muster does not
support gets the same warning or 400 as in a YAML file.
"""

from __future__ import annotations

import re
from typing import Any

from dstack_api.services.errors import DstackError

# the client fills these in whatever the user wrote (reference §4, §7)
CLIENT_CPU = {"arch": None, "count": {"min": 2, "max": None}}
CLIENT_MEMORY = {"min": 8.0, "max": None}
CLIENT_DISK = {"size": {"min": 100.0, "max": None}}
CLIENT_GPU_COUNT = {"min": 0, "max": None}
# dumped defaults of dstack's configuration models that mean "not written"
CLIENT_KEY_DEFAULTS = {"privileged": False, "home_dir": "/root", "dstack": False, "blocks": 1}
TPU_NAME = re.compile(r"v\d+[a-z]*(pod)?-\d+", re.IGNORECASE)
PROFILE_SKIP = ("name", "default")


def _unset(value: Any) -> bool:
    return value is None or value == [] or value == {}


def _without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    return value


def _numbers_equal(a: Any, b: Any) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_numbers_equal(a[k], b[k]) for k in a)
    if isinstance(a, int | float) and isinstance(b, int | float) and not isinstance(a, bool):
        return float(a) == float(b)
    return a == b


def _gpu(gpu: Any) -> Any:
    if not isinstance(gpu, dict):
        return gpu
    rest = {k: v for k, v in gpu.items() if k != "count" and v is not None}
    count = gpu.get("count")
    if not rest and (count is None or _numbers_equal(count, CLIENT_GPU_COUNT)):
        return None  # `gpu: 0..`, the client's default: no GPU asked for
    names = rest.get("name")
    if isinstance(names, list) and len(names) == 1 and isinstance(names[0], str) and TPU_NAME.fullmatch(names[0]):
        # the client strips `tpu-` and adds count 1..; a TPU slice is named whole in Muster
        return f"tpu-{names[0]}"
    out = _without_nulls(rest)
    if count is not None:
        out["count"] = _without_nulls(count)
    return out


def resources(raw: Any) -> Any:
    """dstack's resources object without the client's defaults (None if nothing is left)."""
    if not isinstance(raw, dict):
        return raw
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if value is None:
            continue
        if key == "cpu" and _numbers_equal(value, CLIENT_CPU):
            continue
        if key == "memory" and _numbers_equal(value, CLIENT_MEMORY):
            continue
        if key == "disk" and _numbers_equal(value, CLIENT_DISK):
            continue
        if key == "gpu":
            value = _gpu(value)
            if value is None:
                continue
        out[key] = _without_nulls(value) if key != "gpu" else value
    return out or None


def _fleet_name(ref: Any) -> Any:
    """dstack's {project, name}: a fleet of another project (dstack's imported fleets) has no place here."""
    if not isinstance(ref, dict):
        return ref
    if ref.get("project") is not None:
        raise DstackError(f"fleets: {ref.get('project')}/{ref.get('name')} is another project's fleet: Muster "
                          "places a run only on its own project's fleets")
    return ref.get("name")


def _port(port: Any) -> Any:
    if not isinstance(port, dict):
        return port
    local, inner = port.get("local_port"), port.get("container_port")
    return inner if local in (None, inner) else f"{local}:{inner}"


def _env(env: Any) -> Any:
    # a key the client left unset arrives as {"key": NAME}: Muster's bare key (request env or a secret)
    if isinstance(env, dict):
        return {k: (None if isinstance(v, dict) and set(v) == {"key"} else v) for k, v in env.items()}
    return env


CONVERT = {
    "resources": resources,
    "fleets": lambda refs: [_fleet_name(r) for r in refs] if isinstance(refs, list) else refs,
    "ports": lambda ports: [_port(p) for p in ports] if isinstance(ports, list) else ports,
    "env": _env,
}


def _keys(conf: dict) -> dict:
    out = {}
    for key, value in conf.items():
        if _unset(value) or (key in CLIENT_KEY_DEFAULTS and value == CLIENT_KEY_DEFAULTS[key]):
            continue
        if key in CONVERT:
            value = CONVERT[key](value)
            if value is None:
                continue
        out[key] = value
    return out


def task_configuration(run_spec: Any) -> dict:
    """The task configuration Muster plans for a dstack run spec; DstackError for what has no place."""
    if not isinstance(run_spec, dict):
        raise DstackError("run_spec: send dstack's run spec object")
    conf = run_spec.get("configuration")
    if not isinstance(conf, dict):
        raise DstackError("run_spec.configuration: send the configuration object the dstack CLI makes")
    repo = run_spec.get("repo_data")
    if isinstance(repo, dict) and repo.get("repo_type") not in (None, "virtual"):
        raise DstackError("Muster runs no repository code: remove `repos:` (or run outside a git checkout "
                          "with `dstack apply --no-repo`)")
    out = _keys(conf)
    groups = out.get("groups")
    if isinstance(groups, list):
        out["groups"] = [_keys(g) if isinstance(g, dict) else g for g in groups]
    if out.get("type") == "service":
        _service_keys(out)
    profile = run_spec.get("profile")
    if isinstance(profile, dict):
        for key, value in profile.items():
            if key not in PROFILE_SKIP and not _unset(value) and key not in out:
                out[key] = value
    if isinstance(run_spec.get("run_name"), str) and run_spec["run_name"]:
        out["name"] = run_spec["run_name"]
    return out


# a service's nested keys the client dumps with nulls for "not written" (dstack's defaults apply)
SERVICE_NESTED = ("scaling", "probes", "rate_limits", "model", "router")


def _service_keys(out: dict) -> None:
    """A service's dump as written: nested nulls dropped; `port` as the client normalizes it (a
    {local_port, container_port} mapping whose container side is the app's port)."""
    for where in [out, *(g for g in out.get("groups") or [] if isinstance(g, dict))]:
        for key in SERVICE_NESTED:
            value = where.get(key)
            if isinstance(value, list):
                where[key] = [_without_nulls(item) for item in value]
            elif isinstance(value, dict):
                where[key] = _without_nulls(value)
    if isinstance(out.get("port"), dict):
        out["port"] = out["port"].get("container_port")


def _ssh_host(host: Any, loc: str) -> Any:
    if not isinstance(host, dict):
        return host
    for key in ("proxy_jump", "internal_ip", "blocks"):
        if host.get(key) is not None:
            raise DstackError(f"{loc}.{key}: Muster's SSH fleets do not support `{key}`: remove it")
    out = {k: v for k, v in host.items() if k in ("hostname", "port", "user") and v is not None}
    key = host.get("ssh_key")
    if isinstance(key, dict) and key.get("private"):
        out["private_key"] = key["private"]
    return out


def fleet_configuration(spec: Any) -> dict:
    """The fleet configuration Muster applies for a dstack fleet spec. The client has read every
    identity_file into `ssh_key` (its path means nothing on the server), so the key content is used."""
    if not isinstance(spec, dict) or not isinstance(spec.get("configuration"), dict):
        raise DstackError("spec.configuration: send the fleet configuration object the dstack CLI makes")
    out = _keys(spec["configuration"])
    ssh = out.get("ssh_config")
    if isinstance(ssh, dict):
        for key in ("proxy_jump", "network"):
            if ssh.get(key) is not None:
                raise DstackError(f"ssh_config.{key}: Muster's SSH fleets do not support `{key}`: remove it")
        made = {k: v for k, v in ssh.items() if k in ("user", "port") and v is not None}
        key = ssh.get("ssh_key")
        if isinstance(key, dict) and key.get("private"):
            made["private_key"] = key["private"]
        made["hosts"] = [_ssh_host(h, f"ssh_config.hosts[{i}]") for i, h in enumerate(ssh.get("hosts") or [])]
        out["ssh_config"] = made
    return out


def without_private_keys(value: Any) -> Any:
    """A spec as echoed back to the client: every `ssh_key.private` blanked (reference §2, risk 2)."""
    if isinstance(value, dict):
        return {k: (_public_only(v) if k == "ssh_key" else without_private_keys(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [without_private_keys(v) for v in value]
    return value


def _public_only(key: Any) -> Any:
    if isinstance(key, dict):
        return {**key, "private": None} if "private" in key else key
    return key
