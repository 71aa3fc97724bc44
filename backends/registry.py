"""Backend name -> Compute class, and the one place outside a backend's own package that names one:
the engine and the apps ask here (and the class, backends/base.py) instead of comparing names
(tests/test_backend_names.py). Imports are lazy so a missing optional dependency stays local."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.utils.module_loading import import_string

from backends.base import Compute

# The TPU slice table is the gcp backend's; the configuration language reads it through here for
# its `gpu: v2-32` words (they expand into hosts before any fleet is chosen). It needs no Google library.
from backends.gcp.tpu_shapes import (  # noqa: F401
    SliceShape,
    looks_like_slice,
    parse_slice,
    valid_sizes_message,
)
from backends.gcp.tpu_shapes import family_named as tpu_family_named  # noqa: F401
from backends.gcp.tpu_shapes import with_topology as slice_with_topology  # noqa: F401

# The product's backends: name -> Compute class. A deployment adds its own by settings
# (MUSTER["EXTRA_BACKENDS"], same shape; the benchmarks' hollow instances come that way).
BACKENDS = {
    "ssh": "backends.ssh.compute.SSHCompute",
    "local": "backends.local.compute.LocalCompute",
    "gcp": "backends.gcp.compute.GcpTpuCompute",
}


# dstack's word for the backend of hosts you have
ALIASES = {"remote": "ssh"}
# the backend of hosts you have, written as a fleet's `ssh_config` and registered over SSH
GIVEN_HOSTS = "ssh"
# the backend whose hosts are this machine, made at once by a fleet's apply (and by bootstrap)
LOCAL_HOSTS = "local"
# a fleet written without `ssh_config` or `backends` is made here
DEFAULT_BACKEND = "local"


def written_names() -> tuple[str, ...]:
    """Every backend name a configuration may write (`backends: [...]`), dstack's aliases too."""
    return (*BACKENDS, *ALIASES, *settings.MUSTER["EXTRA_BACKENDS"])


def fleet_backend(backends: list[str] | None, given_hosts: bool = False) -> str:
    """The backend a written fleet is made by: the one of given hosts when it lists them
    (`ssh_config`), else the first of `backends`, else the default."""
    if given_hosts:
        return GIVEN_HOSTS
    name = (backends or [DEFAULT_BACKEND])[0]
    return ALIASES.get(name, name)


def dstack_name(backend: str) -> str:
    """The backend's name in dstack's answers (its fleets of hosts are all dstack's `remote`)."""
    path = BACKENDS.get(backend) or settings.MUSTER["EXTRA_BACKENDS"].get(backend)
    return import_string(path).dstack_name if path else "remote"


def compute_class(name: str) -> type[Compute]:
    path = BACKENDS.get(name) or settings.MUSTER["EXTRA_BACKENDS"].get(name)
    if path is None:
        raise ValueError(f"unknown backend {name!r}")
    return import_string(path)


def get_compute(name: str, config: dict[str, Any] | None = None) -> Compute:
    return compute_class(name)(config)


def load_every_backend() -> None:
    """Import every backend a fleet may name, the deployment's own too (muster/warm.py)."""
    for name in {**settings.MUSTER["EXTRA_BACKENDS"], **BACKENDS}:
        compute_class(name)


def creates_groups(backend: str) -> bool:
    """Static fleets (local, ssh, hollow) hold registered hosts; group-creating ones make them."""
    return compute_class(backend).creates_groups


def user_keys_over_ssh(backend: str) -> bool:
    """Whether a user's attach or shell key can be put on the backend's hosts (ssh, and gcp's TPU VMs)."""
    return compute_class(backend).user_keys_over_ssh


def compute_for_instance(instance) -> Compute:
    fleet = instance.fleet
    if fleet is None and instance.group_id is not None:
        return get_compute(instance.backend, group_backend_config(instance.group))
    return get_compute(instance.backend, fleet_backend_config(fleet) if fleet else {})


def compute_for_group(group) -> Compute:
    """The backend that made `group`, with the group's settings."""
    return get_compute(group_backend(group), group_backend_config(group))


def group_backend(group) -> str:
    # groups made before their row named the backend are all gcp's
    return group.backend_data.get("backend", "gcp")


def group_noun(group) -> str:
    """What `group` is called in events ("TPU slice")."""
    return compute_class(group_backend(group)).group_noun


def fleet_backend_config(fleet) -> dict[str, Any]:
    return compute_class(fleet.backend).fleet_config(fleet.configuration)


def kept_for_group(fleet) -> dict[str, Any]:
    """What a group keeps of its fleet's backend settings when it is made (`backend_data["fleet"]`),
    so that it can still be deleted once the fleet's row is gone: a fleet's deletion removes the row
    before its slices' delete steps run (engine/fleet_deletion.py)."""
    return compute_class(fleet.backend).kept_for_group(fleet.configuration)


def group_backend_config(group) -> dict[str, Any]:
    """A group's backend settings: its fleet's; for a group whose fleet is gone (`fleet` is SET_NULL),
    the server's settings with what the group kept of its fleet's (an older group kept nothing: the
    server's alone)."""
    if group.fleet is not None:
        return fleet_backend_config(group.fleet)
    return compute_class(group_backend(group)).group_config(group.backend_data.get("fleet") or {})


# What the apps use of the product's own host backends that the contract does not cover: hosts you
# have are reached over SSH by their registration, health look, attach keys and address policy,
# and a plan asks this machine's Docker. Reached through here so that no module outside backends/
# imports a backend; each is imported when first used.

def ssh_target(**fields: Any):
    """How to reach a host over SSH (backends/ssh/connection.py: SSHTarget)."""
    from backends.ssh.connection import SSHTarget

    return SSHTarget(**fields)


def ssh_runner_host(target, timeout: float):
    """The runner channel to a host you have, before or besides its instance's row."""
    from backends.ssh.runner_host import SSHRunnerHost

    return SSHRunnerHost(target, timeout=timeout)


def attach_keys():
    """The module that installs and removes attach keys in a host's authorized_keys."""
    from backends.ssh import attach_keys as module

    return module


def address_policy():
    """The module holding the SSH host policy (which addresses Muster may reach)."""
    from backends.ssh import address_policy as module

    return module


def local_docker() -> dict[str, Any]:
    """This machine's Docker, as local hosts see it."""
    from backends.local.host import local_docker as look

    return look()
