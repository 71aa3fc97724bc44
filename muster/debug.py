"""What a 500 may show: Django's technical page only with DEBUG explicitly on and only to a
client on this machine, and never the values a submission carries."""

from __future__ import annotations

import ipaddress

from django.views.debug import ExceptionReporter, SafeExceptionReporterFilter

PLAIN_500 = "<!doctype html>\n<title>Server Error (500)</title>\n<h1>Server Error (500)</h1>\n"


# a proxy on this machine makes every client look like loopback; these say one forwarded the request
PROXY_HEADERS = ("HTTP_X_FORWARDED_FOR", "HTTP_FORWARDED", "HTTP_X_REAL_IP")


def from_loopback(request) -> bool:
    if any(header in request.META for header in PROXY_HEADERS):
        return False
    try:
        return ipaddress.ip_address((request.META.get("REMOTE_ADDR") or "").split("%")[0]).is_loopback
    except ValueError:
        return False


class ReporterFilter(SafeExceptionReporterFilter):
    """Django's filter switches itself off with DEBUG on, which is when the technical page shows
    every local variable of a failed submission (its configuration, its secret env, the project's
    decrypted secrets): this one stays on."""

    def is_active(self, request):
        return True


class LoopbackOnlyReporter(ExceptionReporter):
    """The technical page for a client on this machine; anyone else gets the plain 500, since
    DEBUG on a dev server bound to 0.0.0.0 is reachable from the whole network. A report made
    without a request (a log handler's) is unchanged."""

    def get_traceback_html(self):
        if self.request is not None and not from_loopback(self.request):
            return PLAIN_500
        return super().get_traceback_html()

    def get_traceback_text(self):
        if self.request is not None and not from_loopback(self.request):
            return "Server Error (500)\n"
        return super().get_traceback_text()
