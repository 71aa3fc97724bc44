"""The services endpoint: `<endpoint>/proxy/services/<project>/<run>/<path>` to a ready replica.

An asynchronous process of its own (aiohttp), started by `python -m django serve_endpoint`, which
`muster serve` supervises and docker-compose runs; stateless, so several may run side by side.
Why a process and not a Django view: a stream (server-sent events, a WebSocket, a long upload)
holds its connection for minutes, and a gunicorn worker held that long is a worker less for the
API. Here a slow client costs one connection and a few kilobytes, never a worker.

- table.py: the routing table in memory (serving/routes.py's read, per service on first use),
  re-read on PostgreSQL's NOTIFY `muster_routes` and on a timer; local ejection of a replica that
  refused a connection.
- auth.py: the project member's API token, checked as the API checks it, cached a few seconds.
- paths.py: what of a request is refused before any replica is touched, and which headers pass.
- forward.py: streaming both ways (chunked bodies, SSE, WebSocket), retries, timeouts, limits.
- server.py: the process: dispatch, request counts for the scaler, /metrics, /healthz.

docs/services.md says how it is run and why it is built this way, with the benchmark's figures.
"""
