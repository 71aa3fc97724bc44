"""Content-Security-Policy for the console's pages: scripts, styles and everything else only from
this server, and no inline script or style at all (none of the templates has any), so markup that
slipped past escaping cannot run."""

from __future__ import annotations

POLICY = "; ".join([
    "default-src 'self'", "script-src 'self'", "style-src 'self'", "img-src 'self' data:", "connect-src 'self'",
    "object-src 'none'", "base-uri 'none'", "form-action 'self'", "frame-ancestors 'none'",
])


class ContentSecurityPolicyMiddleware:
    """Only the console's pages, and the admin log-in's 429 (console/login.py, a console template):
    the admin's and the Swagger UI's own pages come with inline scripts of their own."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        match = request.resolver_match
        if match is not None and (match.namespace == "console"
                                  or (match.route == "admin/login/" and response.status_code == 429)):
            response.headers.setdefault("Content-Security-Policy", POLICY)
        return response
