"""The client side of the API: where the server and token come from, and one HTTP client.

Standard library only (urllib), like the rest of the CLI.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import yaml

DEFAULT_PROJECT = "main"
HTTP_TIMEOUT = 30.0
MAX_PAGES = 1000  # of a paged list: a server that always answers `next` cannot keep the CLI forever
NEXT_LINK = re.compile(r'<([^>]+)>\s*;\s*rel="?next"?')


class CliError(Exception):
    """A failure to report on stderr; `code` is the process exit status."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


class UsageError(CliError):
    def __init__(self, message: str):
        super().__init__(message, code=2)


class Unreachable(CliError):
    """The server did not answer; follow loops keep trying instead of giving up on the run."""


# ---- settings -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    url: str
    token: str
    project: str


def config_path() -> Path:
    # Resolved on each call so HOME set by a test (or a wrapper script) is honoured.
    return Path("~/.muster/config").expanduser()


def read_config_file() -> dict[str, str]:
    path = config_path()
    if not path.exists():
        return {}
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise CliError(f"{path}: cannot read: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise CliError(f"{path}: expected a mapping with url, token and project")
    return {str(k): str(v) for k, v in data.items() if v is not None}


def server_url(url: str, source: str) -> str:
    """The server's base URL as the client joins paths to it, from what a user wrote.

    `http://host:8000/api` (copied from the API docs' address) means the server at
    `http://host:8000`; a URL without a scheme is refused rather than guessed, since the server may
    answer HTTPS only.
    """
    url = url.strip().rstrip("/")
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise CliError(f"{source} {url!r} has no scheme: write http://{url} (or https://{url})")
    if scheme.lower() not in ("http", "https") or not rest:
        raise CliError(f"{source} {url!r}: expected http://HOST[:PORT] or https://HOST[:PORT]")
    if url.lower().endswith("/api"):
        url = url[: -len("/api")]
    return url


def load_settings(project: str | None = None, environ: Mapping[str, str] = os.environ) -> Settings:
    """Each setting from the command line, else the environment, else ~/.muster/config."""
    file = read_config_file()
    url = environ.get("MUSTER_URL") or file.get("url")
    token = environ.get("MUSTER_TOKEN") or file.get("token")
    if not url or not token:
        raise CliError("no server configured: set MUSTER_URL and MUSTER_TOKEN, "
                       "or run `muster config --url URL --token TOKEN`")
    source = "MUSTER_URL" if environ.get("MUSTER_URL") else f"url in {config_path()}"
    project = project or environ.get("MUSTER_PROJECT") or file.get("project") or DEFAULT_PROJECT
    return Settings(url=server_url(url, source), token=token, project=project)


def write_config(url: str, token: str, project: str | None) -> Path:
    url = server_url(url, "--url")
    path = config_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        data: dict[str, str] = read_config_file()
    except CliError:
        data = {}  # a broken file is exactly what `muster config` is run to replace
    data.update(url=url, token=token)
    if project:
        data["project"] = project
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # O_CREAT's mode does not apply to a file that already existed
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(data, f, sort_keys=False)
    return path


# ---- HTTP -----------------------------------------------------------------------------------------


def format_loc(loc: list[Any]) -> str:
    """`["configuration", "groups", 0, "commands"]` -> `configuration.groups[0].commands`, the way
    the server's configuration messages write a location."""
    out = ""
    for part in loc:
        if isinstance(part, int) and not isinstance(part, bool):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def format_error(error: Mapping[str, Any]) -> str:
    """{"loc": ["configuration", "groups", 0], "msg": m} -> `configuration.groups[0]: m`."""
    loc = format_loc(list(error.get("loc") or []))
    msg = str(error.get("msg", ""))
    return f"{loc}: {msg}" if loc else msg


def api_error(status: int, raw: bytes, url: str = "the server") -> CliError:
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    hint = " (check MUSTER_TOKEN or `muster config`)" if status == 401 else ""
    if isinstance(body, dict) and isinstance(body.get("errors"), list):
        lines = [format_error(e) if isinstance(e, dict) else str(e) for e in body["errors"]]
        return CliError(("\n".join(lines) or f"HTTP {status}") + hint)
    if isinstance(body, dict) and "detail" in body:  # a server from before the one error shape
        return CliError(f"{body['detail']}{hint}")
    return CliError(not_an_api(status, raw, url))


def not_an_api(status: int, raw: bytes, url: str) -> str:
    """What to say of an answer that is not the API's JSON (a docs page, a proxy's error page):
    never the page itself."""
    where = url.split("/api/", 1)[0] if "/api/" in url else url
    looks_html = raw.lstrip()[:15].lower().startswith((b"<!doctype", b"<html", b"<"))
    what = "an HTML page" if looks_html else ("an empty answer" if not raw.strip() else "an answer that is not JSON")
    return (f"{where} is not a Muster API: it answered HTTP {status} with {what}. Set MUSTER_URL "
            "(or `muster config --url`) to the server's address, e.g. http://HOST:8000")


def _json(raw: bytes, url: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        raise CliError(not_an_api(200, raw, url)) from None


class Client:
    """JSON over HTTP to one project of one server."""

    def __init__(self, settings: Settings, timeout: float = HTTP_TIMEOUT):
        self.settings = settings
        self.timeout = timeout
        self.base = f"{settings.url}/api/projects/{quote(settings.project, safe='')}/"

    def get(self, path: str, **query: Any) -> Any:
        return self.request("GET", path, query=query)

    def post(self, path: str, body: Any) -> Any:
        return self.request("POST", path, body=body)

    def delete(self, path: str, **query: Any) -> Any:
        return self.request("DELETE", path, query=query)

    def get_pages(self, path: str, **query: Any) -> list[Any]:
        """Every item of a paged list (GET runs/), page after page while the answer has a
        `Link: <url>; rel="next"`. Only the link's query (its cursor) is taken, on this client's own
        URL: the token never goes to another host, and a proxy that rewrites the scheme or host
        in the server's links does not matter."""
        items: list[Any] = []
        url = self._url(path, query)
        for _ in range(MAX_PAGES):
            raw, headers = self._send("GET", url)
            items += _json(raw, url) if raw else []
            found = NEXT_LINK.search(headers.get("Link") or "")
            if found is None:
                return items
            url = self.base + path + "?" + urlsplit(found.group(1)).query
        raise CliError(f"{path}: more than {MAX_PAGES} pages")

    def _url(self, path: str, query: Mapping[str, Any] | None) -> str:
        params = {k: v for k, v in (query or {}).items() if v is not None}
        return self.base + path + ("?" + urlencode(params) if params else "")

    def request(self, method: str, path: str, body: Any = None, query: Mapping[str, Any] | None = None) -> Any:
        url = self._url(path, query)
        raw, _ = self._send(method, url, body)
        return _json(raw, url) if raw else None

    def _send(self, method: str, url: str, body: Any = None) -> tuple[bytes, Any]:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Authorization": f"Token {self.settings.token}", "Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        req = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                raw, headers = resp.read(), resp.headers
        except urllib.error.HTTPError as exc:
            raise api_error(exc.code, exc.read(), url) from None
        except urllib.error.URLError as exc:
            raise Unreachable(f"cannot reach {self.settings.url}: {exc.reason}") from None
        except (OSError, http.client.HTTPException) as exc:
            raise Unreachable(f"cannot reach {self.settings.url}: {exc}") from None
        return raw, headers
