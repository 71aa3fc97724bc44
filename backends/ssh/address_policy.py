"""Which addresses the server may open an SSH connection to: the operator's allow and deny lists.

A policy of its own because it applies to every connection, not only when a fleet is registered
(`connection` checks each resolved address just before connecting to that very address), and it
is a rule a reader should find without reading the transport.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable


def _networks(cidrs: Iterable[str]) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    return [ipaddress.ip_network(c.strip(), strict=False) for c in cidrs if c.strip()]


def address_allowed(address: str, allow: Iterable[str], deny: Iterable[str]) -> bool:
    """Deny wins over allow; an empty allow list allows every address not denied."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        ip = ip.ipv4_mapped  # ::ffff:127.0.0.1 is loopback too
    allowed = _networks(allow)
    if any(ip in net for net in _networks(deny) if net.version == ip.version):
        return False
    return not allowed or any(ip in net for net in allowed if net.version == ip.version)


def host_policy() -> tuple[list[str], list[str]]:
    """(allow, deny) CIDRs of MUSTER_SSH_HOSTS_ALLOW / _DENY; applied to every SSH connection, not only
    at registration, so a name that later resolves elsewhere is held to the same rule."""
    from django.conf import settings

    return list(settings.MUSTER.get("SSH_HOSTS_ALLOW") or []), list(settings.MUSTER.get("SSH_HOSTS_DENY") or [])

