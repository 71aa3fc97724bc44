"""`python -m django serve_endpoint`: the services endpoint (serving/proxy/), in the foreground."""

from __future__ import annotations

import asyncio

from django.conf import settings
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Serve /proxy/services/<project>/<run>/ (the services endpoint) on MUSTER_ENDPOINT_BIND or --bind."
    requires_system_checks = []  # checked by the test suite; a restart should cost no check

    def add_arguments(self, parser):
        parser.add_argument("--bind", default="", help="host:port (default MUSTER_ENDPOINT_BIND)")

    def handle(self, *args, **options):
        from serving.proxy.server import serve

        bind = options["bind"] or settings.MUSTER["ENDPOINT_BIND"]
        try:
            try:
                import uvloop
            except ImportError:  # asyncio's own loop: the same behaviour, fewer requests per second
                asyncio.run(serve(bind))
            else:
                uvloop.run(serve(bind))
        except KeyboardInterrupt:
            pass
