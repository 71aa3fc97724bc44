"""Where a service is reached: its URL at the endpoint (serving/proxy/), built in one place for the
API, the CLI's answer and the console."""

from __future__ import annotations

from urllib.parse import quote

from django.conf import settings


def endpoint_url() -> str:
    """The endpoint's public base URL (MUSTER_ENDPOINT_URL), without a trailing slash."""
    return settings.MUSTER["ENDPOINT_URL"].rstrip("/")


def endpoint_tls() -> bool:
    """Whether clients reach the endpoint over TLS (a TLS proxy in front of it)."""
    return endpoint_url().startswith("https://")


def url_for(project: str, run: str) -> str:
    return f"{endpoint_url()}/proxy/services/{quote(project, safe='')}/{quote(run, safe='')}/"


def service_url(run) -> str:
    """`<endpoint>/proxy/services/<project>/<run>/` of a service run."""
    return url_for(run.project.name, run.name)
