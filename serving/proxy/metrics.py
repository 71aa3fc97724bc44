"""The endpoint's Prometheus metrics, per service (labels `project`, `service`): requests by
status code, errors by kind, the time to the replica's first byte (a histogram; for a stream it
is the time to its first chunk, as the stream's length says nothing of the proxy), and the ready
replicas this process routes to. Each endpoint process serves its own at `/metrics` on its port;
Prometheus scrapes every process and sums (docs/services.md).

The error kinds: `no_replica` (503), `replicas_failed` (every ready replica refused), `replica_error`
(a dropped connection or a malformed answer), `timeout` (a replica's silence past the read timeout),
`database` (a read the request needed failed even on a new connection: 503).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # as the web's /metrics (console/metrics.py)
LABELS = ("project", "service")
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    def __init__(self):
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("muster_service_requests", "Requests to a service through this endpoint process, "
                                "by status code", [*LABELS, "code"], registry=self.registry)
        self.errors = Counter("muster_service_errors", "Requests to a service that failed at the endpoint or "
                              "its replica, by kind", [*LABELS, "kind"], registry=self.registry)
        self.latency = Histogram("muster_service_first_byte_seconds", "Seconds from a request's arrival to "
                                 "its replica's first byte", LABELS, buckets=BUCKETS, registry=self.registry)
        self.ready = Gauge("muster_service_ready_replicas", "Ready replicas of a service this endpoint process "
                           "routes to", LABELS, registry=self.registry)

    def loaded(self, service) -> None:
        self.ready.labels(service.project, service.name).set(len(service.replicas))

    def observe(self, service, status: int, error: str | None, first_byte: float | None) -> None:
        labels = (service.project, service.name)
        self.requests.labels(*labels, str(status)).inc()
        if error:
            self.errors.labels(*labels, error).inc()
        if first_byte is not None:
            self.latency.labels(*labels).observe(first_byte)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE
