"""Request rates per caller (DRF throttling), read from settings at each request so an operator's
MUSTER_THROTTLE_* (and a test's override) apply without a restart of the throttle classes.

Counters live in Django's cache: the default local-memory cache counts per process, so with N
web processes a caller gets up to N times the rate (docs/security.md).
"""

from __future__ import annotations

from django.conf import settings
from rest_framework.throttling import AnonRateThrottle, UserRateThrottle


class UserThrottle(UserRateThrottle):
    def get_rate(self):
        return settings.MUSTER.get("THROTTLE_USER") or None


class AnonThrottle(AnonRateThrottle):
    def get_rate(self):
        return settings.MUSTER.get("THROTTLE_ANON") or None
