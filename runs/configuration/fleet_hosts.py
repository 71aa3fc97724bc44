"""An SSH fleet's hosts: fleet-level defaults applied to each host, duplicates and missing
users or keys found, and host keys read from known_hosts lines.

A module of its own because an SSH fleet is exactly its hosts: these are the rules that decide
which machines Muster will log in to and which host key each must present.
"""

from __future__ import annotations

import base64
import binascii
import struct

from pydantic import Field

from .errors import ErrorList
from .fields import CheckedModel
from .fleet_written import _FleetInput

DEFAULT_SSH_PORT = 22


class SSHHost(CheckedModel):
    """One host with the fleet-level defaults already applied."""

    hostname: str
    port: int
    user: str
    identity_file: str | None
    private_key: str | None = Field(default=None, repr=False)  # key content: never in logs
    host_key: str | None = None  # "<keytype> <base64>": the key the host must present


class SSHConfig(CheckedModel):
    hosts: list[SSHHost]


def check_ssh_hosts(fleet: _FleetInput, errors: ErrorList) -> SSHConfig:
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


