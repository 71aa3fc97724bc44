"""What of a request the endpoint refuses before any replica is touched, and which headers pass.

The path is read raw (as the client sent it, before any decoding): a `..` or `.` segment (also
percent-encoded), an encoded slash or backslash, a NUL, or a project or run name with anything
but the names' own characters is a 400, so no spelling of a path reaches another service's prefix
or climbs out of this one's. A Muster API key in the query string is a 400 too: URLs end up in
logs, histories and Referer headers; the key belongs in the Authorization header.

Headers: hop-by-hop ones never pass (RFC 9110 7.6.1, and whatever `Connection` names). With
`auth: true` the Authorization header holds the Muster key and is not forwarded; with `auth:
false` it is the application's own and is. Muster's own cookies (the console's session and CSRF
cookies, sent when the endpoint shares the console's host behind the TLS proxy) and any
`X-Muster-*` header are never forwarded; the application's other cookies are. Back from the
replica, a `Set-Cookie` naming one of Muster's cookies or carrying a `Domain=` attribute is dropped:
an application must not set the console's session, nor a cookie for hosts beyond the endpoint's.

X-Forwarded-For/-Host/-Proto from the client are believed only from a trusted peer (the TLS proxy in
front: MUSTER_ENDPOINT_TRUSTED_PROXIES); from anyone else they are replaced by the peer's address,
the Host and the scheme the endpoint saw, so a client cannot pose as another address or as HTTPS.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import parse_qsl, unquote

from projects.services.tokens import KEY_PREFIX

PREFIX = "/proxy/services/"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
_ENCODED_BAD = re.compile(r"%(2f|5c|00)", re.IGNORECASE)

HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization",
                        "te", "trailer", "transfer-encoding", "upgrade"})
# X-Forwarded-For gets the peer appended; a trusted proxy's X-Forwarded-Proto/Host pass, else they are set
REQUEST_DROPPED = HOP_BY_HOP | {"host", "x-forwarded-for", "x-forwarded-prefix", "x-forwarded-proto",
                                "x-forwarded-host"}
WEBSOCKET_OWN = frozenset({"sec-websocket-key", "sec-websocket-version", "sec-websocket-extensions",
                           "sec-websocket-protocol", "sec-websocket-accept"})


class Refused(Exception):
    """A request answered by the endpoint itself: `code` (the HTTP status) and why."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.code, self.message = status, message


@dataclass(frozen=True)
class Target:
    project: str
    run: str
    tail: str  # the path after the service's prefix, raw, with its leading slash
    query: str  # raw, without the '?'
    trailing_slash_missing: bool = False

    @property
    def prefix(self) -> str:
        return f"{PREFIX}{self.project}/{self.run}"


def parse(raw_path: str) -> Target:
    """The service and the rest of a raw request target `/proxy/services/<project>/<run>/<path>`."""
    path, _, query = raw_path.partition("?")
    if "\\" in path or _ENCODED_BAD.search(path) or "\x00" in path:
        raise Refused(400, "the path may not hold a backslash, a NUL or an encoded slash")
    if ("." in path or "%2" in path) and any(unquote(segment) in (".", "..") for segment in path.split("/")):
        raise Refused(400, "the path may not hold '.' or '..' segments")
    if "//" in path:
        raise Refused(400, "the path may not hold empty segments ('//')")
    parts = path[len(PREFIX):].split("/", 2)
    if len(parts) < 2 or not all(_NAME.match(p) for p in parts[:2]):
        raise Refused(404, "no such service: the URL is /proxy/services/<project>/<run>/<path>")
    project, run = parts[0], parts[1]
    if len(parts) == 2:
        return Target(project, run, "/", query, trailing_slash_missing=True)
    return Target(project, run, "/" + parts[2], query)


def key_in_query(query: str) -> bool:
    return any(value.startswith(KEY_PREFIX) or name.startswith(KEY_PREFIX)
               for name, value in parse_qsl(query, keep_blank_values=True))


def upstream_path(target: Target, strip_prefix: bool) -> str:
    path = target.tail if strip_prefix else target.prefix + target.tail
    return f"{path}?{target.query}" if target.query else path


def _without_cookies(header: str, names: frozenset[str]) -> str:
    kept = [c for c in (p.strip() for p in header.split(";")) if c and c.split("=", 1)[0].strip() not in names]
    return "; ".join(kept)


def trusted_networks(setting: str) -> tuple:
    """MUSTER_ENDPOINT_TRUSTED_PROXIES (comma-separated addresses or CIDRs) parsed once."""
    return tuple(ipaddress.ip_network(part.strip(), strict=False) for part in setting.split(",") if part.strip())


def is_trusted(peer: str, trusted: tuple) -> bool:
    try:
        address = ipaddress.ip_address(peer.strip("[]"))
    except ValueError:  # no address (a Unix socket) or not one: not a proxy we know
        return False
    return any(address in network for network in trusted)


def request_headers(headers, *, auth: bool, muster_cookies: frozenset[str], peer: str, host: str, scheme: str,
                    prefix: str | None, websocket: bool = False, trusted: tuple = ()) -> list[tuple[str, str]]:
    """The headers the replica gets (a list: repeated headers stay repeated); the client's
    X-Forwarded-* count only when `peer` is in `trusted` (trusted_networks)."""
    named = {h.strip().lower() for h in headers.get("Connection", "").split(",")}
    drop = REQUEST_DROPPED | named | (WEBSOCKET_OWN if websocket else frozenset())
    out = []
    for name, value in headers.items():
        lower = name.lower()
        if lower in drop or lower.startswith("x-muster-") or (auth and lower == "authorization"):
            continue
        if lower == "cookie" and muster_cookies:
            value = _without_cookies(value, muster_cookies)
            if not value:
                continue
        out.append((name, value))
    believed = is_trusted(peer, trusted)
    forwarded_for = headers.get("X-Forwarded-For") if believed else None
    out.append(("X-Forwarded-For", f"{forwarded_for}, {peer}" if forwarded_for else peer))
    out.append(("X-Forwarded-Host", headers.get("X-Forwarded-Host", host) if believed else host))
    out.append(("X-Forwarded-Proto", headers.get("X-Forwarded-Proto", scheme) if believed else scheme))
    if prefix:
        out.append(("X-Forwarded-Prefix", prefix))
    return out


RESPONSE_DROPPED = HOP_BY_HOP | {"content-length"}


def response_headers(headers, muster_cookies: frozenset[str] = frozenset()) -> list[tuple[str, str]]:
    named = {h.strip().lower() for h in headers.get("Connection", "").split(",")}
    return [(k, v) for k, v in headers.items() if k.lower() not in RESPONSE_DROPPED and k.lower() not in named
            and not (k.lower() == "set-cookie" and _foreign_cookie(v, muster_cookies))]


def _foreign_cookie(value: str, muster_cookies: frozenset[str]) -> bool:
    """A replica's cookie that would overwrite the console's session or CSRF cookie, or reach past
    the endpoint's own host (a `Domain=` attribute: the console's host is within a parent domain)."""
    name, _, rest = value.partition("=")
    if name.strip() in muster_cookies:
        return True
    return any(attr.split("=", 1)[0].strip().lower() == "domain" for attr in rest.split(";")[1:])
