"""`muster queue`: the project's runs waiting for a host, in the order hosts go to them (the API's
`queue/`, runs/queue.py): the highest priority first, then the oldest."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from cli.prompts import client_for
from cli.render import table


def cmd_queue(args: argparse.Namespace) -> int:
    query = {"fleet": args.fleet} if args.fleet else {}
    answer = client_for(args).get("queue/", **query)
    rows = answer.get("runs") or []
    where = f" for fleet {args.fleet}" if args.fleet else ""
    print(queue_table(rows) if rows else f"No runs of project {answer.get('project')} wait for a host{where}.")
    return 0


def queue_table(rows: Sequence[dict[str, Any]]) -> str:
    return table(["#", "project", "run", "job", "priority", "waiting", "reason"], [
        (r.get("position"), r.get("project"), r.get("run"), r.get("job"), r.get("priority"),
         duration(r.get("wait_seconds")), r.get("reason")) for r in rows])


def duration(seconds: int | None) -> str:
    """A wait as `45s`, `12m 5s`, `3h 20m`, `2d 4h`."""
    if seconds is None:
        return "-"
    for unit, size, sub, subsize in (("d", 86400, "h", 3600), ("h", 3600, "m", 60), ("m", 60, "s", 1)):
        if seconds >= size:
            return f"{seconds // size}{unit} {seconds % size // subsize}{sub}"
    return f"{seconds}s"


def add_queue_command(sub: Any, command) -> None:
    queue = command(sub, "queue", cmd_queue, help="the project's runs waiting for a host, in the order hosts go to "
                                                  "them (highest priority, then oldest)")
    queue.add_argument("--fleet", help="only the runs waiting for this fleet (their places stay the project's)")
