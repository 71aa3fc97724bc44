"""What `muster serve` shows on its terminal when it is quiet (the default).

The children (web, worker, beat) write everything to files in the data directory; the supervisor
echoes from those files only the lines an operator must see (warnings, errors, tracebacks), and
the state changes of runs, read from the events table. Without this the worker's INFO lines (about
seven a second) scroll the token and the admin password away within a second of start.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

# celery's "[2026-01-01 10:00:00,000: WARNING/MainProcess] ..." and Django's plain tracebacks
# and gunicorn's "[2026-01-01 10:00:00 +0000] [123] [ERROR] ..."
NOTABLE = re.compile(r"(WARNING|ERROR|CRITICAL)[/:]|\[(WARNING|ERROR|CRITICAL)\]|^Traceback |Internal Server Error"
                     r"|^\S*Error\b")
# said by runserver at every start of `muster serve --dev`
EXPECTED = ("This is a development server",)
# a file grown by more than this between two looks is skimmed, not echoed whole
READ_CAP = 1 << 20
EVENT_POLL_SECONDS = 1.0
MAX_EVENTS_PER_POLL = 200


def echo(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class LogTail:
    """The lines added to one child's log file since the last look."""

    def __init__(self, name: str, path: Path):
        self.name, self.path = name, path
        self.offset = path.stat().st_size if path.exists() else 0  # an earlier serve's lines are old news
        self.partial = b""
        self.in_traceback = False

    def notable_lines(self) -> list[str]:
        try:
            with self.path.open("rb") as f:
                f.seek(0, 2)
                size = f.tell()
                if size < self.offset:  # replaced or truncated: start over
                    self.offset, self.partial = 0, b""
                f.seek(self.offset)
                data = f.read(READ_CAP)
        except OSError:
            return []
        self.offset += len(data)
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()[-READ_CAP:]
        shown = []
        for raw in lines:
            line = raw.decode("utf-8", errors="replace").rstrip()
            if any(text in line for text in EXPECTED):
                continue
            if NOTABLE.search(line) or (self.in_traceback and line.startswith((" ", "\t"))):
                shown.append(f"{self.name}: {line}")
                self.in_traceback = line.startswith("Traceback ") or (self.in_traceback and line[:1] in " \t")
            else:
                self.in_traceback = False
        return shown


class RunEvents:
    """Run state changes as they are recorded (events with subject `run NAME`)."""

    def __init__(self):
        self.last_id = self._latest()
        self.next_poll = 0.0

    @staticmethod
    def _latest() -> int:
        from django.db import DatabaseError

        from events.models import Event

        try:
            return Event.objects.order_by("-id").values_list("id", flat=True).first() or 0
        except DatabaseError:
            return 0

    def lines(self, now: float) -> list[str]:
        if now < self.next_poll:
            return []
        self.next_poll = now + EVENT_POLL_SECONDS
        from django.db import DatabaseError, connection

        from events.models import Event

        try:
            rows = list(Event.objects.filter(id__gt=self.last_id).order_by("id")
                        .values_list("id", "created", "subject", "status", "message", "project__name")
                        [:MAX_EVENTS_PER_POLL])
        except DatabaseError:
            connection.close()  # e.g. SQLite busy: try again with a new connection next time
            return []
        shown = []
        for event_id, created, subject, status, message, project in rows:
            self.last_id = event_id
            if subject.startswith("run "):
                when = created.astimezone().strftime("%H:%M:%S")
                shown.append(f"{when} {project}/{subject} [{status}] {message}")
        return shown


class Console:
    def __init__(self, logs: dict[str, Path]):
        self.tails = [LogTail(name, path) for name, path in logs.items()]
        self.events = RunEvents()

    def tick(self) -> None:
        for tail in self.tails:
            for line in tail.notable_lines():
                echo(line)
        for line in self.events.lines(time.monotonic()):
            echo(line)
