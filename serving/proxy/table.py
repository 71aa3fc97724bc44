"""The endpoint's routing table: each service it was asked for, with its ready replicas, in memory.

A service is read (serving/routes.py, in a thread: the ORM is synchronous) on its first request
and kept; it is read again when PostgreSQL says it changed (LISTEN `muster_routes`, payload the run
id, sent on commit by the engine) and on a timer, the safety net for a lost notification or a
reconnect and the only way on SQLite. A name that is no service is remembered briefly, so a
stream of requests to it costs one read a second, not one per request.

A replica that refuses a connection leaves this process's pool at once (ejected) for EJECT
seconds or until the service's next notified change, whichever comes first: the engine's probes
take it out for every process soon after, and a replica back before that is used again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from serving.routes import Replica, Service

log = logging.getLogger("muster.endpoint")

EJECT = 5.0
MISSING_FOR = 1.0  # seconds a name that is no service is remembered
IDLE_DROP = 600.0  # a service nobody asked for this long is forgotten (read again on its next request)
MAX_MISSING = 10_000


@dataclass
class Entry:
    service: Service | None
    loaded: float
    used: float = 0.0
    turn: int = 0
    ejected: dict[int, float] = field(default_factory=dict)
    # set and replaced on every read that brings replicas: a request waiting for one wakes up
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def pick(self, exclude: set[int]) -> Replica | None:
        """The next ready replica in turn, leaving out ejected ones and those already tried."""
        if self.service is None:
            return None
        now = time.monotonic()
        pool = [r for r in self.service.replicas if r.job_id not in exclude and self.ejected.get(r.job_id, 0.0) <= now]
        if not pool:
            return None
        self.turn += 1
        return pool[self.turn % len(pool)]

    def eject(self, replica: Replica) -> None:
        self.ejected[replica.job_id] = time.monotonic() + EJECT


class Table:
    def __init__(self, read: Callable[[str, str], Service | None], read_run: Callable[[int], Service | None],
                 executor: ThreadPoolExecutor, on_load: Callable[[Service], None] | None = None):
        self._read, self._read_run, self._executor = read, read_run, executor
        self._on_load = on_load or (lambda service: None)
        self.entries: dict[tuple[str, str], Entry] = {}
        self._by_run: dict[int, tuple[str, str]] = {}
        self._loading: dict[tuple[str, str], asyncio.Future] = {}
        # services notified while a read of them was under way: that read may have begun before the
        # change was committed, so another follows it
        self._stale: set[tuple[str, str]] = set()

    async def _in_thread(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def get(self, project: str, name: str) -> Entry:
        key = (project, name)
        entry = self.entries.get(key)
        now = time.monotonic()
        if entry is None or (entry.service is None and now - entry.loaded > MISSING_FOR):
            entry = await self.load(key)
        entry.used = now
        return entry

    async def load(self, key: tuple[str, str], notified: bool = False) -> Entry:
        """Read one service again; concurrent calls for the same service share one read, and a
        notification that arrives during a read brings another read once it is done (each read's
        answer is kept: a stream of notifications never leaves the entry unread)."""
        pending = self._loading.get(key)
        if pending is not None:
            if notified:
                self._stale.add(key)
            return await asyncio.shield(pending)
        future = asyncio.get_running_loop().create_future()
        self._loading[key] = future
        self._stale.discard(key)
        try:
            service = await self._in_thread(self._read, *key)
            entry = self._store(key, service, notified)
            future.set_result(entry)
            return entry
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: a read nobody else awaited must not log "never retrieved"
            raise
        finally:
            del self._loading[key]
            if key in self._stale:  # notified during this read, which may have begun before the change
                self._stale.discard(key)
                asyncio.get_running_loop().create_task(self._reload_quietly(key, notified=True))

    def _store(self, key: tuple[str, str], service: Service | None, notified: bool) -> Entry:
        entry = self.entries.get(key)
        if entry is None:
            if service is None and sum(e.service is None for e in self.entries.values()) >= MAX_MISSING:
                self._forget_missing()
            entry = self.entries[key] = Entry(service, time.monotonic())
        else:
            if service is None or entry.service is None or service.run_id != entry.service.run_id or notified:
                entry.ejected.clear()
            entry.service, entry.loaded = service, time.monotonic()
        if service is not None:
            self._by_run[service.run_id] = key
            self._on_load(service)
            if service.replicas:
                entry.changed.set()
                entry.changed = asyncio.Event()
        return entry

    def _forget_missing(self) -> None:
        for key in [k for k, e in self.entries.items() if e.service is None]:
            del self.entries[key]

    def changed(self, run_id: int) -> None:
        """A notification: read the run's service again, if this process has it."""
        key = self._by_run.get(run_id)
        if key is not None and key in self.entries:
            asyncio.get_running_loop().create_task(self._reload_quietly(key, notified=True))

    async def _reload_quietly(self, key: tuple[str, str], notified: bool = False) -> None:
        try:
            await self.load(key, notified)
        except Exception:  # the database away: the entry stays as it was, the timer tries again
            log.exception("reading service %s/%s", *key)

    async def refresh_all(self) -> None:
        now = time.monotonic()
        for key, entry in list(self.entries.items()):
            if now - entry.used > IDLE_DROP or entry.service is None:
                self.entries.pop(key, None)
                if entry.service is not None:
                    self._by_run.pop(entry.service.run_id, None)
                continue
            await self._reload_quietly(key)

    async def refresh_forever(self, every: float) -> None:
        while True:
            await asyncio.sleep(every)
            await self.refresh_all()

    async def listen_forever(self, conninfo: str) -> None:
        """LISTEN on PostgreSQL and re-read each notified service; reconnect when the connection
        breaks, reading every service again then (what changed meanwhile was not heard)."""
        import psycopg

        from serving.rows import listen_routes

        backoff = 1.0
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
                    await listen_routes(conn)
                    backoff = 1.0
                    await self.refresh_all()
                    async for note in conn.notifies():
                        try:
                            self.changed(int(note.payload))
                        except ValueError:
                            log.warning("ignoring a %s notification with payload %r", note.channel, note.payload)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("routing notifications: %s; listening again in %gs", exc, backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 30.0)
