"""Who may use the dstack SSH gateway, for which job, and which forwards it opens.

The gateway (dstack_api/gateway/) asks these at each connection, again at each channel it opens and
every DSTACK_SSH_RECHECK seconds while a connection is open, so a key deleted, a user deactivated or
a member removed stops working within that bound, open forwards included.

A forward to a job's port is a TCP connection made by the control plane, so the address it goes to
is held to the SSH host policy (backends/ssh/address_policy.py), the same function every SSH
connection and the registration's check of a host's reported address use: a host that says its
address is 127.0.0.1 or 169.254.169.254 must not turn the gateway into a proxy to the server's own
loopback or the cloud's metadata service.
"""

from __future__ import annotations

import base64
import ipaddress
import logging
import uuid
from dataclasses import dataclass
from types import SimpleNamespace

from django.conf import settings
from django.http import Http404
from rest_framework.exceptions import PermissionDenied

from backends.registry import LOCAL_HOSTS, address_policy
from dstack_api.models import UserSSHKey
from projects.services import access
from runs.models import Job
from runs.services.attach import ATTACHABLE, job_ports

log = logging.getLogger(__name__)
# the dstack-runner's HTTP port: the CLI forwards it and reads the log WebSocket there
RUNNER_HTTP_PORT = 10999
LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")
USER_SUFFIX = "_root"  # the CLI logs in to the proxy as `<upstream_id>_root`
# dstack's ProxyJump path: the CLI logs in as `<upstream_id>_jump` and asks for a stream to the job's
# host, in which the gateway itself is the SSH server (server.py); as `<upstream_id>_root` inside
JUMP_SUFFIX = "_jump"


def upstream_id(job: Job) -> str:
    return job.uuid.hex


def connection_info(job: Job) -> dict:
    """dstack's job_connection_info for the sshproxy path: where the CLI dials and whom it names."""
    conf = settings.MUSTER
    bind_host, _, bind_port = conf["DSTACK_SSH_BIND"].rpartition(":")
    # a wildcard bind has no one address to tell the CLI: the operator names it (PUBLIC_HOST)
    host = conf["DSTACK_SSH_PUBLIC_HOST"] or ("127.0.0.1" if bind_host in ("", "0.0.0.0", "[::]") else bind_host)
    port = conf["DSTACK_SSH_PUBLIC_PORT"] or int(bind_port)
    return {"sshproxy_hostname": host, "sshproxy_port": port, "sshproxy_upstream_id": upstream_id(job)}


def jump_host(job: Job) -> dict:
    """dstack's `ssh_proxy` (JobProvisioningData) naming the gateway as the job's jump host. Unlike the
    sshproxy path, dstack's CLI checks no host key on this one (StrictHostKeyChecking=no on both
    hops), so `dstack project add` is all a user does: no known_hosts line to fetch and add."""
    info = connection_info(job)
    return {"hostname": info["sshproxy_hostname"], "port": info["sshproxy_port"],
            "username": upstream_id(job) + JUMP_SUFFIX}


def jump_login(username: str) -> str | None:
    """The `<upstream_id>_root` that a jump login `<upstream_id>_jump` stands for, or None."""
    return username[: -len(JUMP_SUFFIX)] + USER_SUFFIX if username.endswith(JUMP_SUFFIX) else None


def user_of_key(key_type: str, blob: bytes):
    """The active user whose dstack key this is, or None (a host's or a fleet's key is never one)."""
    wanted = f"{key_type} {base64.b64encode(blob).decode()}"
    for key in UserSSHKey.objects.select_related("user").filter(public_key__startswith=wanted + " "):
        if key.user.is_active:
            return key.user
    return None


@dataclass(frozen=True)
class Grant:
    """A login's job and what it may open: logs for every member, the job's ports for writers only
    (`muster attach` refuses read-only members the same way)."""

    job: Job
    ports: bool


def grant_for(user, username: str) -> Grant | None:
    """What `<upstream_id>_root` gives `user`: None unless the user may read the job's project."""
    if not username.endswith(USER_SUFFIX):
        return None
    try:
        job_uuid = uuid.UUID(hex=username[: -len(USER_SUFFIX)])
    except ValueError:
        return None
    job = Job.objects.select_related("run__project", "instance").filter(uuid=job_uuid).first()
    if job is None:
        return None
    try:
        access.project_for(SimpleNamespace(user=user, method="GET"), job.run.project.name)
    except Http404:
        return None
    try:  # the write check, as for any change: read-only raises
        access.project_for(SimpleNamespace(user=user, method="POST"), job.run.project.name)
    except PermissionDenied:
        return Grant(job, ports=False)
    return Grant(job, ports=True)


def still_allowed(user_pk: int, key_type: str, blob: bytes, username: str) -> Grant | None:
    """Checked again at each channel and while connected: the key must still be the same user's,
    the user still a member."""
    user = user_of_key(key_type, blob)
    if user is None or user.pk != user_pk:
        return None
    return grant_for(user, username)


@dataclass(frozen=True)
class Target:
    logs: bool
    ip: str = ""
    port: int = 0


def address_refusal(instance) -> str:
    """Why the gateway does not connect to this instance's address ("" when it may).

    An SSH or gcp host's address is what the host reported, so it is judged by the SSH host policy.
    A local instance is the server's own machine by design (docs/security.md: only superusers' runs
    go there) and its 127.0.0.x address is Muster's own choice, not a host's word: it may be loopback,
    and nothing else."""
    ip = instance.internal_ip or ""
    try:
        parsed = ipaddress.ip_address(ip)
    except ValueError:
        return f"the instance has no IP address ({ip!r})"
    if instance.backend == LOCAL_HOSTS:
        return "" if parsed.is_loopback else "a local instance's address must be loopback"
    return address_policy().refusal(ip, forward_policy())


def forward_policy():
    """The SSH host policy tightened for forwards (backends/ssh/address_policy.py forward_policy): a
    forward is a TCP connection the control plane makes on a member's word."""
    return address_policy().forward_policy()


def forward_target(grant: Grant, host: str, port: int) -> Target | None:
    """Where a `-L` to host:port goes: the runner log endpoint, or the job's own port on its host;
    None for anything else (another host, another port, a job not on a host, a read-only member's
    port forward, an address the host policy refuses)."""
    if host not in LOCAL_NAMES:
        return None
    if port == RUNNER_HTTP_PORT:
        return Target(logs=True)
    job = grant.job
    if not grant.ports or port not in job_ports(job) or job.status not in ATTACHABLE or job.instance is None:
        return None
    why = address_refusal(job.instance)
    if why:
        log.warning("dstack gateway: job %s: not forwarding to %s: %s", job.uuid.hex, job.instance.internal_ip, why)
        return None
    return Target(logs=False, ip=job.instance.internal_ip, port=port)
