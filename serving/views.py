"""The web's answer to /proxy/services/...: a 307 to the endpoint (serving/proxy/), which serves it.

So `<server>/proxy/services/<project>/<run>/` (dstack's in-server URL) works for every client that
follows redirects, while the streams themselves never hold a web worker. 307 keeps the method and
the body. When the endpoint's URL is this very origin (a TLS proxy in front of both that does not
route /proxy/ to the endpoint), a redirect would loop: that is a 503 saying what to fix.
"""

from __future__ import annotations

from django.http import HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from serving.proxy.paths import PREFIX
from serving.urls_for import endpoint_url


@csrf_exempt  # a redirect: nothing is changed here, and the endpoint does its own auth
def to_endpoint(request):
    base = endpoint_url()
    if base == f"{request.scheme}://{request.get_host()}":
        return JsonResponse({"detail": "the services endpoint is not in front of this server: route /proxy/ to "
                                       "it (MUSTER_ENDPOINT_URL, docs/services.md)"}, status=503)
    # the path as the client sent it (gunicorn's RAW_URI): the endpoint checks it as sent; anything
    # else there (an absolute URI, `//host`) would make the Location name another host
    raw = request.META.get("RAW_URI") or ""
    path = raw if raw.startswith(PREFIX) else request.get_full_path()
    return HttpResponse(status=307, headers={"Location": base + path})
