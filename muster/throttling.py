"""Request rates per caller (DRF throttling), read from settings at each request so an operator's
MUSTER_THROTTLE_* (and a test's override) apply without a restart of the throttle classes.

Counters live in Django's cache: the default local-memory cache counts per process, so with N
web processes a caller gets up to N times the rate (docs/security.md).
"""

from __future__ import annotations

import functools
import math

from django.conf import settings
from django.http import JsonResponse
from rest_framework.throttling import AnonRateThrottle, UserRateThrottle


class UserThrottle(UserRateThrottle):
    def get_rate(self):
        return settings.MUSTER["THROTTLE_USER"] or None


class AnonThrottle(AnonRateThrottle):
    def get_rate(self):
        return settings.MUSTER["THROTTLE_ANON"] or None


def throttled(view):
    """A console view counted against the API's per-user rate (the same counter: reading a log
    through both does not double it); over it, a 429 with Retry-After, as the API answers."""

    @functools.wraps(view)
    def wrapped(request, *args, **kwargs):
        throttle = UserThrottle()
        if throttle.allow_request(request, None):
            return view(request, *args, **kwargs)
        wait = max(1, math.ceil(throttle.wait() or 1))
        return JsonResponse({"detail": f"Request was throttled (MUSTER_THROTTLE_USER). Expected available in {wait} "
                                       f"seconds.", "retry_after": wait}, status=429, headers={"Retry-After": str(wait)})

    return wrapped
