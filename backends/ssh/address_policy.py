"""Which addresses the server may open an SSH connection to: the operator's allow and deny lists,
and the server's own addresses.

A policy of its own because it applies to every connection, not only when a fleet is registered
(`connection` checks each resolved address just before connecting to that very address, and the
address the socket is connected to after), and it is a rule a reader should find without reading
the transport.

An address is judged with every IPv4 address it embeds (IPv4-mapped, IPv4-compatible, NAT64,
6to4, Teredo): a deny list that names 127.0.0.0/8 must not be passed by ::ffff:127.0.0.1 or
64:ff9b::7f00:1. Spellings such as `2130706433` or `0x7f.1` need nothing here: the resolver turns
them into 127.0.0.1 before the check, which sees only resolved addresses.

The server's own addresses are refused when the operator says so (production's default): on Linux a
connection to 0.0.0.0 or :: reaches a listener on the local machine, and so does one to any address
of its interfaces; a fleet host there would be the control plane itself, whose worker holds the
encryption keys. They are read from the kernel at each check, so an address added later counts.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from django.conf import settings

IP = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

# What reaches the local machine whatever its interfaces: the unspecified addresses (0.0.0.0/8 is
# "this network", which Linux connects to locally) and loopback.
ALWAYS_OWN = ("0.0.0.0/8", "127.0.0.0/8", "::/128", "::1/128")
_NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))
_TRANSLATED = ipaddress.ip_network("::ffff:0:0:0/96")  # SIIT's IPv4-translated ::ffff:0:a.b.c.d
_COMPATIBLE = ipaddress.ip_network("::/96")  # deprecated IPv4-compatible ::a.b.c.d

FIB_TRIE = Path("/proc/net/fib_trie")
IF_INET6 = Path("/proc/net/if_inet6")


@dataclass(frozen=True)
class HostPolicy:
    allow: list[str] = field(default_factory=list)
    deny: list[str] = field(default_factory=list)
    deny_own: bool = False
    own_allow: list[str] = field(default_factory=list)  # own addresses the operator lets fleets use


def _networks(cidrs: Iterable[str]) -> list[Network]:
    return [ipaddress.ip_network(c.strip(), strict=False) for c in cidrs if c.strip()]


def _parse(address: str) -> IP:
    return ipaddress.ip_address(address.split("%", 1)[0])


def forms(ip: IP) -> list[IP]:
    """The address and every IPv4 address it embeds, the canonical one first."""
    if isinstance(ip, ipaddress.IPv4Address):
        return [ip]
    low = ipaddress.IPv4Address(ip.packed[12:])
    embedded: list[IP] = []
    if ip.ipv4_mapped:
        embedded.append(ip.ipv4_mapped)
    if ip in _TRANSLATED or ip in _COMPATIBLE or any(ip in net for net in _NAT64):
        embedded.append(low)
    if ip.sixtofour:
        embedded.append(ip.sixtofour)
    if ip.teredo:
        embedded.append(ip.teredo[1])  # the client's address (ipaddress undoes the XOR)
    if ip.ipv4_mapped:
        return [ip.ipv4_mapped, ip, *embedded[1:]]  # ::ffff:a.b.c.d is a.b.c.d to the kernel
    return [ip, *embedded]


def _within(ips: Iterable[IP], networks: Iterable[Network]) -> bool:
    nets = list(networks)
    return any(ip in net for ip in ips for net in nets if net.version == ip.version)


def own_networks() -> list[Network]:
    """Every address of this machine's interfaces (in this network namespace), plus ALWAYS_OWN."""
    found = _networks(ALWAYS_OWN)
    try:
        found += _fib_local(FIB_TRIE.read_text())
    except OSError:
        pass  # no /proc (not Linux): loopback and the unspecified addresses are still refused
    try:
        for line in IF_INET6.read_text().splitlines():
            parts = line.split()
            if parts:
                found.append(ipaddress.IPv6Network(int(parts[0], 16)))
    except (OSError, ValueError):
        pass
    return found


def _fib_local(text: str) -> list[Network]:
    """The LOCAL entries of /proc/net/fib_trie: the kernel's own list of addresses it answers for."""
    found, leaf = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("|-- "):
            leaf = stripped[4:]
        elif leaf and stripped.startswith("/") and stripped.endswith("host LOCAL"):
            found.append(ipaddress.ip_network(f"{leaf}{stripped.split()[0]}", strict=False))
    return found


def refusal(address: str, policy: HostPolicy) -> str:
    """Why the server does not connect to `address` ("" when it may). Deny wins over allow; an
    empty allow list allows every address not denied."""
    ip = _parse(address)
    every = forms(ip)
    if policy.deny_own and _within(every, own_networks()) and not _within(every[:1], _networks(policy.own_allow)):
        return "it is an address of the Muster server itself"
    if _within(every, _networks(policy.deny)):
        return "it is on a network the operator denies (MUSTER_SSH_HOSTS_DENY)"
    allowed = _networks(policy.allow)
    if allowed and not _within(every[:1], allowed):
        return "it is not on a network the operator allows (MUSTER_SSH_HOSTS_ALLOW)"
    return ""


def host_policy() -> HostPolicy:
    """MUSTER_SSH_HOSTS_ALLOW / _DENY and the own-address rule; applied to every SSH connection, not
    only at registration, so a name that later resolves elsewhere is held to the same rule."""
    muster = settings.MUSTER
    return HostPolicy(list(muster["SSH_HOSTS_ALLOW"]), list(muster["SSH_HOSTS_DENY"]),
                      bool(muster["SSH_DENY_OWN_ADDRESSES"]), list(muster["SSH_OWN_ADDRESSES_ALLOW"]))


# link-local: the cloud's metadata service (169.254.169.254) and IPv6's equivalent
FORWARD_DENY = ("169.254.0.0/16", "fe80::/10")


def forward_policy() -> HostPolicy:
    """The host policy, tightened for a TCP connection the control plane makes to a port a user's job
    names (the dstack gateway's forwards, the router sync's and the queue scrape's HTTP to a replica):
    in every environment it never reaches the server's own addresses (loopback included) or link-local
    ones, unless the operator names them (MUSTER_SSH_OWN_ADDRESSES_ALLOW, MUSTER_SSH_HOSTS_ALLOW);
    `muster serve` may bind wherever, so "only in production" would not do."""
    policy = host_policy()
    named = policy.allow + policy.own_allow
    return replace(policy, deny_own=True, deny=policy.deny + [net for net in FORWARD_DENY if net not in named])
