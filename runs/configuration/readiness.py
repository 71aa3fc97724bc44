"""Readiness keys of a group (or of a `nodes:` task): `probes`, `ready_timeout` and `depends_on`.

`probes` keeps the schema and defaults of dstack's service probes (`type: http`, `url`, `method`,
`headers`, `body`, `timeout`, `interval`, `ready_after`, `until_ready`) and adds `port`,
`type: tcp | exec` and `command`. The runner on the node's host runs them against 127.0.0.1
(runner/probes.py); a node is ready once every probe has passed `ready_after` times in a row.
`depends_on` makes a group start only once other groups are ready (or done): any DAG.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from .durations import parse_duration
from .errors import ErrorList
from .fields import CheckedModel, Port, WrittenModel, check_group_name, read_model

DEFAULT_READY_TIMEOUT = 30 * 60  # seconds, Kueue's waitForPodsReady default
MAX_READY_TIMEOUT = 30 * 86400
MAX_PROBES = 16
MAX_HEADERS = 16  # dstack's limit
MAX_URL = 2048
MAX_BODY = 64 * 1024
MAX_COMMAND_ARGS = 64
MAX_READY_AFTER = 100
# A probe call is bounded on both sides: at least a second (a zero timeout never passes), at most
# what a health check can sensibly take; the interval from once a second to once an hour.
TIMEOUT_RANGE = (1, 300)
INTERVAL_RANGE = (1, 3600)
ProbeType = Literal["http", "tcp", "exec"]
ProbeMethod = Literal["get", "post", "put", "delete", "patch", "head"]
Condition = Literal["ready", "done"]
CONDITION_DONE = "done"  # a dependency met once every job of the group ended `done`


def _bounded_duration(value: object, low: int, high: int, what: str) -> int:
    seconds = parse_duration(value)
    if not low <= seconds <= high:
        raise ValueError(f"{what} must be between {low}s and {high}s")
    return seconds


class _HeaderInput(WrittenModel):
    name: str
    value: str

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not value or any(c in value for c in ":\r\n ") or not value.isascii():
            raise ValueError(f"`{value[:40]}` is not an HTTP header name")
        return value

    @field_validator("value")
    @classmethod
    def _value(cls, value: str) -> str:
        if "\r" in value or "\n" in value or len(value) > 4096:
            raise ValueError("a header value is one line of at most 4096 characters")
        return value


class _ProbeInput(WrittenModel):
    type: ProbeType = "http"
    url: str | None = None
    method: ProbeMethod | None = None
    headers: list[_HeaderInput] = []
    body: str | None = None
    port: Port | None = None
    command: list[str] | None = None
    interval: Any = 15
    timeout: Any = 10
    ready_after: int = 1
    until_ready: bool = False

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None and (not value.startswith("/") or len(value) > MAX_URL
                                  or any(c.isspace() for c in value)):
            raise ValueError(f"url must be a path starting with `/`, without spaces, at most {MAX_URL} characters")
        return value

    @field_validator("headers")
    @classmethod
    def _headers(cls, value: list) -> list:
        if len(value) > MAX_HEADERS:
            raise ValueError(f"at most {MAX_HEADERS} headers")
        return value

    @field_validator("body")
    @classmethod
    def _body(cls, value: str | None) -> str | None:
        if value is not None and len(value.encode()) > MAX_BODY:
            raise ValueError(f"body must be at most {MAX_BODY} bytes")
        return value

    @field_validator("command")
    @classmethod
    def _command(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and (not value or not value[0] or len(value) > MAX_COMMAND_ARGS):
            raise ValueError(f"command is a non-empty list of at most {MAX_COMMAND_ARGS} strings, "
                             "the program first: [test, -f, /tmp/loaded]")
        return value

    @field_validator("interval")
    @classmethod
    def _interval(cls, value: object) -> int:
        return _bounded_duration(value, *INTERVAL_RANGE, "interval")

    @field_validator("timeout")
    @classmethod
    def _timeout(cls, value: object) -> int:
        return _bounded_duration(value, *TIMEOUT_RANGE, "timeout")

    @field_validator("ready_after")
    @classmethod
    def _ready_after(cls, value: int) -> int:
        if not 1 <= value <= MAX_READY_AFTER:
            raise ValueError(f"ready_after must be between 1 and {MAX_READY_AFTER}")
        return value


class _DependencyInput(WrittenModel):
    group: str
    condition: Condition = "ready"

    @field_validator("group")
    @classmethod
    def _group(cls, value: str) -> str:
        return check_group_name(value) or value


class Probe(CheckedModel):
    """One probe as the runner runs it (runner/probes.py reads these fields)."""

    type: ProbeType
    url: str
    method: ProbeMethod
    headers: list[dict[str, str]]
    body: str | None
    port: int | None  # None only for exec
    command: list[str] | None
    interval: int
    timeout: int
    ready_after: int
    until_ready: bool


class Dependency(CheckedModel):
    group: str
    condition: Condition


class Readiness(CheckedModel):
    probes: list[Probe] = Field(default_factory=list)
    ready_timeout: int = DEFAULT_READY_TIMEOUT
    depends_on: list[Dependency] = Field(default_factory=list)


def read_readiness(raw: dict, loc: list[str | int], ports: list[int | str], errors: ErrorList,
                   *, depends_allowed: bool = True) -> tuple[Readiness | None, list[Dependency]]:
    """The readiness keys of one group (`raw`: the group as written): the probes and timeout (None
    when any has a problem), and the dependencies that could be read (the graph is checked once
    every group is read, `check_dependencies`)."""

    before = len(errors.items)
    probes = []
    written = raw.get("probes", [])
    if not isinstance(written, list):
        errors.add([*loc, "probes"], "expected a list of probes")
        written = []
    if len(written) > MAX_PROBES:
        errors.add([*loc, "probes"], f"at most {MAX_PROBES} probes")
    for i, item in enumerate(written):
        probe = read_model(_ProbeInput, item, [*loc, "probes", i], errors)
        if probe is not None:
            probes.append(_checked_probe(probe, [*loc, "probes", i], ports, errors))
    ready_timeout = DEFAULT_READY_TIMEOUT
    if raw.get("ready_timeout") is not None:
        try:
            ready_timeout = _bounded_duration(raw["ready_timeout"], 1, MAX_READY_TIMEOUT, "ready_timeout")
        except ValueError as exc:
            errors.add([*loc, "ready_timeout"], str(exc))
    bad = len(errors.items) > before
    depends = _read_depends_on(raw, loc, errors) if depends_allowed else []
    if bad:
        return None, depends
    return Readiness(probes=[p for p in probes if p is not None], ready_timeout=ready_timeout,
                     depends_on=depends), depends


def _checked_probe(probe: _ProbeInput, loc: list[str | int], ports: list[int | str],
                   errors: ErrorList) -> Probe | None:
    before = len(errors.items)
    if probe.type == "exec":
        if probe.command is None:
            errors.add([*loc, "command"], "an exec probe needs `command`: a list like [test, -f, /tmp/loaded]")
        for key in ("url", "method", "body", "port"):
            if getattr(probe, key) is not None:
                errors.add([*loc, key], f"`{key}` is for http and tcp probes; an exec probe has `command`")
        if probe.headers:
            errors.add([*loc, "headers"], "`headers` is for http probes")
    else:
        if probe.command is not None:
            errors.add([*loc, "command"], f"`command` is for exec probes; a {probe.type} probe has `port`")
        if probe.type == "tcp":
            for key in ("url", "method", "body"):
                if getattr(probe, key) is not None:
                    errors.add([*loc, key], f"`{key}` is for http probes; a tcp probe only connects to `port`")
            if probe.headers:
                errors.add([*loc, "headers"], "`headers` is for http probes")
    port = None
    if probe.type != "exec":
        port = _probe_port(probe.port, ports)
        if port is None:
            errors.add([*loc, "port"], "set `port`, or list the port the node serves on in the group's `ports`")
    if len(errors.items) > before:
        return None
    return Probe(
        type=probe.type, url=probe.url or "/", method=probe.method or "get",
        headers=[{"name": h.name, "value": h.value} for h in probe.headers], body=probe.body, port=port,
        command=probe.command, interval=probe.interval, timeout=probe.timeout, ready_after=probe.ready_after,
        until_ready=probe.until_ready,
    )


def _probe_port(written: int | str | None, ports: list[int | str]) -> int | None:
    value = written if written is not None else (ports[0] if ports else None)
    if isinstance(value, str):
        # `local:container`: the node serves on the container side (host networking)
        value = int(value.partition(":")[2])
    return value


def _read_depends_on(raw: dict, loc: list[str | int], errors: ErrorList) -> list[Dependency]:

    written = raw.get("depends_on", [])
    if not isinstance(written, list):
        errors.add([*loc, "depends_on"], "expected a list of group names or {group: NAME, condition: ready | done}")
        return []
    found = []
    for i, item in enumerate(written):
        item = {"group": item} if isinstance(item, str) else item
        dep = read_model(_DependencyInput, item, [*loc, "depends_on", i], errors)
        if dep is not None:
            found.append(Dependency(group=dep.group, condition=dep.condition))
    return found


def check_dependencies(names: list[str], locs: list[list[str | int]], depends: list[list[Dependency]],
                       startup_order: str, errors: ErrorList) -> None:
    """Every name known, no group twice, no cycle, and no `startup_order` besides `any` with it."""
    index = {name: i for i, name in enumerate(names)}
    if startup_order != "any":
        for loc, deps in zip(locs, depends, strict=True):
            if deps:
                errors.add([*loc, "depends_on"], f"`depends_on` cannot be combined with "
                           f"startup_order: {startup_order}: remove one (depends_on orders any groups)")
    edges: dict[int, list[int]] = {i: [] for i in range(len(names))}
    for i, (loc, deps) in enumerate(zip(locs, depends, strict=True)):
        seen: set[str] = set()
        for d, dep in enumerate(deps):
            where = [*loc, "depends_on", d, "group"]
            if dep.group not in index:
                errors.add(where, f"no group is named `{dep.group}`: use one of {', '.join(names)}")
            elif dep.group == names[i]:
                errors.add(where, f"group `{dep.group}` cannot depend on itself")
            elif dep.group in seen:
                errors.add(where, f"`{dep.group}` is listed twice")
            else:
                edges[i].append(index[dep.group])
            seen.add(dep.group)
    cycle = _find_cycle(edges)
    if cycle:
        path = " -> ".join(names[i] for i in [*cycle, cycle[0]])
        errors.add([*locs[cycle[0]], "depends_on"], f"the groups' depends_on form a cycle: {path}")


def _find_cycle(edges: dict[int, list[int]]) -> list[int]:
    """One cycle of the graph (its nodes in order), or [] for a DAG. Iterative: a run may have
    thousands of groups, deeper than Python's recursion."""
    remaining = {node: len(out) for node, out in edges.items()}
    needed_by: dict[int, list[int]] = {node: [] for node in edges}
    for node, out in edges.items():
        for dep in out:
            needed_by[dep].append(node)
    free = [node for node, n in remaining.items() if n == 0]
    while free:
        node = free.pop()
        del remaining[node]
        for user in needed_by[node]:
            remaining[user] -= 1
            if remaining[user] == 0:
                free.append(user)
    if not remaining:
        return []
    # every node left waits on another node left: walking those edges must come back on itself
    node, seen = next(iter(remaining)), []
    while node not in seen:
        seen.append(node)
        node = next(dep for dep in edges[node] if dep in remaining)
    return seen[seen.index(node):]
