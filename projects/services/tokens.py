"""API tokens: issued once (the caller sees the key one time), stored as a hash, with an expiry.

Clients keep sending `Authorization: Token <key>`.
"""

from __future__ import annotations

import functools
import hashlib
import secrets
from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection
from django.utils import timezone
from rest_framework import authentication, exceptions

from projects.models import ApiToken

KEY_PREFIX = "mst_"


def digest_of(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def issue(user, lifetime_days: float | None = None) -> tuple[ApiToken, str]:
    """A new token for `user` and its key, which is not stored anywhere: show it now or lose it.

    lifetime_days: None takes MUSTER_TOKEN_LIFETIME_DAYS; 0 (either way) never expires.
    """
    days = settings.MUSTER["TOKEN_LIFETIME_DAYS"] if lifetime_days is None else lifetime_days
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    expires = timezone.now() + timedelta(days=days) if days else None
    token = ApiToken.objects.create(user=user, prefix=key[:12], digest=digest_of(key), expires=expires)
    return token, key


@functools.cache
def _user_by_digest_sql() -> str:
    # Every API request asks this: as written SQL it costs a third of the ORM query it replaces
    # (building and compiling the query was most of that; docs/performance.md)
    user, token = get_user_model()._meta, ApiToken._meta
    return (f'SELECT u.* FROM "{user.db_table}" u JOIN "{token.db_table}" t ON t.user_id = u."{user.pk.column}" '
            "WHERE t.digest = %s AND (t.expires IS NULL OR t.expires > %s)")


def user_for_key(key: str):
    """The active user `key` belongs to, or None (unknown, expired, or the user is deactivated)."""
    if not key or len(key) > 200:
        return None
    now = connection.ops.adapt_datetimefield_value(timezone.now())
    found = list(get_user_model().objects.raw(_user_by_digest_sql(), [digest_of(key), now]))
    return found[0] if found and found[0].is_active else None


class TokenAuthentication(authentication.BaseAuthentication):
    keyword = "Token"

    def authenticate(self, request):
        parts = authentication.get_authorization_header(request).split()
        if not parts or parts[0].lower() != self.keyword.lower().encode():
            return None
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed("send `Authorization: Token <key>` with one key")
        try:
            key = parts[1].decode()
        except UnicodeError:
            raise exceptions.AuthenticationFailed("invalid token") from None
        user = user_for_key(key)
        if user is None:
            raise exceptions.AuthenticationFailed("invalid or expired token: make a new one with "
                                                  "`manage.py muster_token USERNAME`")
        return user, None

    def authenticate_header(self, request):
        return self.keyword
