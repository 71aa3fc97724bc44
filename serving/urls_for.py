"""Where a service is reached: the endpoint's public base URL, and a service's URL under it."""

from __future__ import annotations

from django.conf import settings

WILDCARDS = ("", "0.0.0.0", "[::]", "::")


def endpoint_base(host: str = "127.0.0.1") -> str:
    """MUSTER_ENDPOINT_URL (production: the TLS proxy's https://... that routes /proxy/ to the
    endpoint), else http://<MUSTER_ENDPOINT_BIND>, with `host` for a wildcard bind's host."""
    given = settings.MUSTER["ENDPOINT_URL"]
    if given:
        return given
    bound, _, port = settings.MUSTER["ENDPOINT_BIND"].rpartition(":")
    return f"http://{host if bound in WILDCARDS else bound}:{port}"


def service_url(run) -> str:
    """`{endpoint}/proxy/services/<project>/<run>/`: what the run's API object shows as `service.url`."""
    return f"{endpoint_base()}/proxy/services/{run.project.name}/{run.name}/"
