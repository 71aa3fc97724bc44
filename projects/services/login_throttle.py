"""Password log-in throttle: failures counted per user name and per client address, locks that
grow, all decided before a password is hashed.

Each try costs a full PBKDF2 on a web process, so a refused try must cost only a cache read. The
counts live in the `login` cache (a database table, or Redis), which every web process shares.
"""

from __future__ import annotations

import hashlib
import ipaddress
import math
import time

from django.conf import settings
from django.contrib.auth.forms import UsernameField
from django.core.cache import caches


def _limits() -> dict:
    m = settings.MUSTER
    return {"window": float(m["THROTTLE_LOGIN_WINDOW"]), "lock": float(m["THROTTLE_LOGIN_LOCK"]),
            "lock_max": float(m["THROTTLE_LOGIN_LOCK_MAX"])}


def _address_key(address: str) -> str:
    # an IPv6 client usually holds a whole /64: counting single addresses would give it 2**64 tries
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return "a:" + hashlib.sha256(address.encode()).hexdigest()
    if ip.version == 6 and not ip.ipv4_mapped:
        return "a:" + str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return "a:" + str(ip.ipv4_mapped if ip.version == 6 else ip)


def _user_key(username: str) -> str:
    # hashed: any text may be sent as a user name, and a cache key must be short and plain
    return "u:" + hashlib.sha256(_as_the_form_reads(username).casefold().encode()).hexdigest()


def _as_the_form_reads(username: str) -> str:
    """The name the log-in form authenticates: Django's form strips it and NFKC-normalises it, so
    `" admin"`, `"admin "` and a fullwidth `ａdmin` all log in as `admin` and must count as `admin`.
    The form's own field does it, so the two cannot drift apart."""
    return UsernameField().to_python(username) or ""


def _keys(address: str, username: str) -> list[tuple[str, int]]:
    m = settings.MUSTER
    return [(_address_key(address), int(m["THROTTLE_LOGIN_ADDRESS_FAILURES"])),
            (_user_key(username), int(m["THROTTLE_LOGIN_FAILURES"]))]


def retry_after(address: str, username: str) -> int:
    """Seconds until this address may try this user name again; 0: it may now."""
    now = time.time()
    states = caches["login"].get_many([key for key, _ in _keys(address, username)])
    until = max((state.get("until", 0) for state in states.values()), default=0)
    return math.ceil(until - now) if until > now else 0


def failed(address: str, username: str) -> None:
    """Count a failed log-in. From the limit on, each failure locks the key for LOCK seconds, twice
    as long as the one before, up to LOCK_MAX; the counts are forgotten WINDOW seconds after the
    last failure (and the lock's end). Two processes counting the same key at once may lose one
    count: a lock comes one try later, never not at all."""
    limits, now, cache = _limits(), time.time(), caches["login"]
    for key, limit in _keys(address, username):
        state = cache.get(key) or {"failures": 0, "until": 0}
        state["failures"] += 1
        if limit > 0 and state["failures"] >= limit:
            lock = min(limits["lock"] * 2 ** min(state["failures"] - limit, 32), limits["lock_max"])
            state["until"] = now + lock
        cache.set(key, state, timeout=math.ceil(limits["window"] + max(state["until"] - now, 0)))


def succeeded(username: str) -> None:
    """A right password clears its user name's count. The address keeps its count: otherwise one
    account an attacker owns would reset the address between guesses at others."""
    caches["login"].delete(_user_key(username))
