"""API tokens: issued once (the caller sees the key one time), stored as a hash, with an expiry.

Clients keep sending `Authorization: Token <key>`.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta

from django.conf import settings
from django.utils import timezone
from rest_framework import authentication, exceptions

from muster.text import NUL
from projects import rows
from projects.models import ApiToken
from projects.services.caller_reads import ProjectRead

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


def _usable(key: str) -> bool:
    return bool(key) and len(key) <= 200


def user_for_key(key: str):
    """The active user `key` belongs to, or None (unknown, expired, or the user is deactivated)."""
    if not _usable(key):
        return None
    user = rows.user_by_digest(digest_of(key), timezone.now())
    return user if user is not None and user.is_active else None


def user_and_project_for_key(key: str, name: str):
    """user_for_key, and the project called `name` with the user's role in it as `caller_role` (None
    when there is no such project): the (user, project) pair, or (None, None)."""
    if not _usable(key):
        return None, None
    found = rows.user_and_project(digest_of(key), timezone.now(), name)
    if found is None or not found[0].is_active:
        return None, None
    return found


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
        # a project-scoped URL's project comes with the user, as DRF's `request.auth`
        # (caller_reads.project_read; projects.services.access.project_for)
        name = ((getattr(request, "parser_context", None) or {}).get("kwargs") or {}).get("project")
        read = None
        if isinstance(name, str) and NUL not in name:
            user, project = user_and_project_for_key(key, name)
            read = ProjectRead(name, project)
        else:
            user = user_for_key(key)
        if user is None:
            raise exceptions.AuthenticationFailed("invalid or expired token: make a new one with "
                                                  "`manage.py muster_token USERNAME`")
        return user, read

    def authenticate_header(self, request):
        return self.keyword
