"""The endpoint process: aiohttp's low-level server, one handler, three paths.

- `/proxy/services/<project>/<run>/<path>`: the service (forward.py), after the checks of
  paths.py and auth.py; nothing reaches a replica before every check passed.
- `/metrics`: this process's Prometheus metrics (metrics.py), under the web's /metrics rule
  (MUSTER_METRICS_TOKEN as a bearer token, or MUSTER_METRICS_OPEN).
- `/healthz`: 200 once the process serves.

Requests that passed the checks are counted per service and added to the database every second
(serving.stats.add_requests, one UPDATE per service), where the scaler reads them.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import aiohttp
from aiohttp import web
from django.conf import settings

from serving.proxy import auth, database, metrics, paths, upstream
from serving.proxy.forward import Limits, Upstream, forward
from serving.proxy.paths import Refused
from serving.proxy.table import EJECT, Table
from serving.proxy.tunnels import Tunnels

log = logging.getLogger("muster.endpoint")
COLD_START_LOOK = 1.0  # seconds between reads of a scale-to-zero service a request waits for


def _json(status: int, message: str, **headers) -> web.Response:
    return web.Response(status=status, text=json.dumps({"detail": message}) + "\n", content_type="application/json",
                        headers=headers)


def _read_service(project: str, name: str):
    from serving.routes import service

    return database.read(service, project, name)


def _ssh_target(instance_id: int):
    from serving.routes import ssh_target

    return database.read(ssh_target, instance_id)


def _read_run(run_id: int):
    from serving.routes import service_by_run

    return database.read(service_by_run, run_id)


class Endpoint:
    def __init__(self):
        conf = settings.MUSTER
        self.muster_cookies = frozenset({settings.SESSION_COOKIE_NAME, settings.CSRF_COOKIE_NAME})
        self.limits = Limits(connect_timeout=conf["ENDPOINT_CONNECT_TIMEOUT"], read_timeout=conf["ENDPOINT_READ_TIMEOUT"],
                             client_timeout=conf["ENDPOINT_CLIENT_TIMEOUT"], max_body=conf["ENDPOINT_MAX_BODY"],
                             muster_cookies=self.muster_cookies)
        self.cold_start_wait = conf["ENDPOINT_COLD_START_WAIT"]
        self.trusted = paths.trusted_networks(conf["ENDPOINT_TRUSTED_PROXIES"])
        # the ORM's reads (routes, tokens, counts) run here, off the event loop
        self.executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="endpoint-db")
        self.metrics = metrics.Metrics()
        self.table = Table(_read_service, _read_run, self.executor, on_load=self.loaded)
        self.tokens = auth.TokenCheck(self.executor, conf["ENDPOINT_AUTH_CACHE"])
        self.tunnels = Tunnels(self.executor, _ssh_target)
        self.counts: Counter[int] = Counter()
        self.session: aiohttp.ClientSession | None = None  # WebSockets
        self.pool = upstream.Pool(self.limits.connect_timeout)  # every other request

    def loaded(self, service) -> None:
        self.metrics.loaded(service)
        # a replica that left the routing table keeps no SSH connection to its host
        self.tunnels.prune({(r.instance_id, r.port) for e in self.table.entries.values() if e.service
                            for r in e.service.replicas})

    async def start(self) -> None:
        # no limit on connections per replica (a stream holds one for its length); idle ones are
        # kept for reuse, so a steady stream of small requests costs no connect each
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30.0, enable_cleanup_closed=True)
        self.session = aiohttp.ClientSession(connector=connector, auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar(),
                                             skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"))

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
        await self.flush()
        self.tunnels.close()
        self.executor.shutdown(wait=False)

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        raw = request.raw_path
        if raw.startswith(paths.PREFIX):
            return await self.service_request(request)
        if raw == "/healthz":
            return web.Response(text="ok\n")
        if raw == "/metrics" and request.method == "GET":
            return self.metrics_response(request)
        return _json(404, "not found: services are at /proxy/services/<project>/<run>/")

    def metrics_response(self, request: web.BaseRequest) -> web.Response:
        token = settings.MUSTER["METRICS_TOKEN"] or ""
        sent = request.headers.get("Authorization", "")
        if token:
            allowed = sent.startswith("Bearer ") and hmac.compare_digest(sent[7:].encode(), token.encode())
        else:
            allowed = bool(settings.MUSTER["METRICS_OPEN"])
        if not allowed:
            return web.Response(status=401 if token else 403, text="metrics: send Authorization: Bearer "
                                "<MUSTER_METRICS_TOKEN> (or set MUSTER_METRICS_OPEN=1 on a closed network)\n")
        body, content_type = self.metrics.render()
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def service_request(self, request: web.BaseRequest) -> web.StreamResponse:
        started = time.monotonic()
        service = None
        report = Upstream()
        status = 500
        try:
            target = paths.parse(request.raw_path)
            if target.trailing_slash_missing:
                location = target.prefix + "/" + (f"?{target.query}" if target.query else "")
                status = 308
                return web.Response(status=308, headers={"Location": location})
            if paths.key_in_query(target.query):
                raise Refused(400, "a Muster API token may not be sent in the URL: send it as "
                                   "`Authorization: Bearer <token>`")
            entry = await self.table.get(target.project, target.run)
            service = entry.service
            # an unknown name asks for a token as a service with auth does: a 404 only to a member,
            # so a caller without one cannot tell which services exist
            if service is None or service.auth:
                await self.authorize(request, target.project)
            if service is None:
                raise Refused(404, f"no running service {target.run} in project {target.project}")
            self.counts[service.run_id] += 1
            path = paths.upstream_path(target, service.strip_prefix)
            headers = paths.request_headers(
                request.headers, auth=service.auth, muster_cookies=self.muster_cookies,
                peer=request.remote or "", host=request.host, scheme=request.scheme,
                prefix=target.prefix if service.strip_prefix else None,
                websocket=request.headers.get("Upgrade", "").lower() == "websocket", trusted=self.trusted)
            response = await forward(request, entry, path, headers, self.session, self.pool, self.limits, report,
                                     self.tunnels)
            if response is None and service.scales_to_zero:
                response = await self.wait_for_replica(request, entry, path, headers, report)
            if response is None:
                report.error = "no_replica"
                ready = len(service.replicas)
                raise Refused(503, f"service {target.project}/{target.run} has no ready replica" + (
                    f" ({service.total_replicas} starting or not ready)" if not ready
                    else f" that accepts connections ({ready} ready, each refused within {EJECT:g}s)"))
            status = response.status
            return response
        except Refused as refused:
            status = refused.code
            extra = {"WWW-Authenticate": 'Bearer realm="muster"'} if refused.code == 401 else {}
            return _json(refused.code, refused.message, **extra)
        except Exception as exc:
            if not database.away(exc):  # a bug: aiohttp's 500, with its traceback in the log
                raise
            # away even on a new connection (database.read): a request that needed a read
            log.error("a request needed the database, which did not answer: %s", exc)
            report.error, status = "database", 503
            return _json(503, "the services endpoint cannot read its database now; try again shortly")
        finally:
            if service is not None:
                first = report.first_byte - started if report.first_byte else None
                self.metrics.observe(service, status, report.error, first)

    async def authorize(self, request: web.BaseRequest, project: str) -> None:
        header = request.headers.get("Authorization")
        if header is None:
            raise Refused(401, "this service needs `Authorization: Bearer <Muster API token>` of a member of "
                               "its project")
        key = auth.bearer(header)
        if key is None:
            raise Refused(401, "send the token as `Authorization: Bearer <Muster API token>`")
        verdict = await self.tokens.check(key, project)
        if verdict == auth.INVALID:
            raise Refused(401, "invalid or expired token")
        if verdict != auth.OK:
            raise Refused(403, f"this token's user is not a member of project {project}")

    async def wait_for_replica(self, request, entry, path, headers, report):
        """A scale-to-zero service with no replica: wait (bounded) for the scaler to start one."""
        deadline = time.monotonic() + self.cold_start_wait
        while time.monotonic() < deadline:
            changed = entry.changed
            try:
                await asyncio.wait_for(changed.wait(), min(COLD_START_LOOK, max(0.0, deadline - time.monotonic())))
            except TimeoutError:
                try:
                    entry = await self.table.load((entry.service.project, entry.service.name))
                except Exception as exc:
                    if not database.away(exc):
                        raise
                    # the database away a moment: the notification or the next second's read brings the replica
                    log.warning("re-reading %s/%s for a waiting request: %s", entry.service.project,
                                entry.service.name, exc)
            if entry.service is None:
                return None
            response = await forward(request, entry, path, headers, self.session, self.pool, self.limits, report,
                                     self.tunnels)
            if response is not None:
                return response
        return None

    async def flush(self) -> None:
        counts, self.counts = self.counts, Counter()
        if not counts:
            return
        pending = dict(counts)  # each run's count leaves it once added
        try:
            await asyncio.get_running_loop().run_in_executor(self.executor, _add_requests, pending)
        except Exception:  # the database away: the counts not added go back, for the next flush
            log.exception("adding request counts")
            self.counts.update(pending)

    async def flush_forever(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            await self.flush()


def _add_requests(counts: dict[int, int]) -> None:
    """Add the counts; each run's leaves `counts` once added (or once it has no row to go to)."""
    from django.db import close_old_connections

    from serving.stats import add_requests

    close_old_connections()
    try:
        for run_id, n in list(counts.items()):
            try:
                add_requests(run_id, n)
            except Exception as exc:
                if database.away(exc):  # flush gives the counts still here back for the next second
                    raise
                # a run deleted meanwhile (its row's foreign key): its count has no home
                log.warning("request count for run %s not added", run_id, exc_info=True)
            del counts[run_id]
    finally:
        # the backend's skipped health check then counts from this flush's end (database.py)
        close_old_connections()


def _conninfo() -> str | None:
    db = settings.DATABASES["default"]
    if "postgresql" not in db["ENGINE"]:
        return None
    from psycopg.conninfo import make_conninfo

    # the web's own connection settings, its OPTIONS (sslmode, ...) included
    options = {k: v for k, v in (db.get("OPTIONS") or {}).items() if isinstance(v, str | int) and k != "pool"}
    given = {**options, "dbname": db.get("NAME"), "user": db.get("USER"), "password": db.get("PASSWORD"),
             "host": db.get("HOST"), "port": db.get("PORT")}
    return make_conninfo(**{k: str(v) for k, v in given.items() if v})


async def serve(bind: str, ready: asyncio.Event | None = None) -> None:
    conf = settings.MUSTER
    endpoint = Endpoint()
    await endpoint.start()
    # keepalive_timeout also bounds a connection that has not finished sending its headers: aiohttp
    # closes a connection idle (no complete request) that long, so a slowloris client costs one
    # connection for ENDPOINT_CLIENT_TIMEOUT seconds
    server = web.Server(endpoint.handle, keepalive_timeout=conf["ENDPOINT_CLIENT_TIMEOUT"],
                        max_line_size=conf["ENDPOINT_MAX_HEADER"], max_field_size=conf["ENDPOINT_MAX_HEADER"],
                        max_headers=conf["ENDPOINT_MAX_HEADERS"], auto_decompress=False, access_log=None)
    runner = web.ServerRunner(server, handle_signals=True, shutdown_timeout=10.0)
    await runner.setup()
    host, _, port = bind.rpartition(":")
    site = web.TCPSite(runner, host.strip("[]") or "0.0.0.0", int(port), backlog=1024, reuse_address=True,
                       reuse_port=True)  # several processes may share a port (bench/proxy.py --endpoints)
    await site.start()
    log.info("services endpoint listening on %s", bind)
    tasks = [asyncio.ensure_future(endpoint.flush_forever()),
             asyncio.ensure_future(endpoint.table.refresh_forever(conf["ENDPOINT_ROUTES_REFRESH"]))]
    conninfo = _conninfo()
    if conninfo:
        tasks.append(asyncio.ensure_future(endpoint.table.listen_forever(conninfo)))
    if ready is not None:
        ready.set()
    try:
        await asyncio.Event().wait()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)  # the LISTEN connection closed, not dropped
        await runner.cleanup()
        await endpoint.close()
