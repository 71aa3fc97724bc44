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

from muster.text import NUL
from projects.models import ApiToken, Project
from projects.services.caller_reads import READ_WITH_CALLER, caller_role_sql

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


def _usable(key: str) -> bool:
    return bool(key) and len(key) <= 200


def user_for_key(key: str):
    """The active user `key` belongs to, or None (unknown, expired, or the user is deactivated)."""
    if not _usable(key):
        return None
    now = connection.ops.adapt_datetimefield_value(timezone.now())
    found = list(get_user_model().objects.raw(_user_by_digest_sql(), [digest_of(key), now]))
    return found[0] if found and found[0].is_active else None


@functools.cache
def _user_and_project_sql() -> str:
    # _user_by_digest_sql with the project a URL names and the user's role in it (access.py's
    # read), so a project-scoped request reads both in one round trip; the columns are named, as
    # the two tables share names (id, name)
    user, token, project = get_user_model()._meta, ApiToken._meta, Project._meta
    user_id = f'u."{user.pk.column}"'
    columns = [f'u."{f.column}"' for f in user.concrete_fields] + [f'p."{f.column}"' for f in project.concrete_fields]
    return (f"SELECT {', '.join(columns)}, {caller_role_sql('p', user_id)} "
            f'FROM "{user.db_table}" u JOIN "{token.db_table}" t ON t.user_id = {user_id} '
            f'LEFT JOIN "{project.db_table}" p ON p.name = %s '
            "WHERE t.digest = %s AND (t.expires IS NULL OR t.expires > %s)")


def user_and_project_for_key(key: str, name: str):
    """user_for_key, and the project called `name` with the user's role in it as `caller_role` (None
    when there is no such project): the (user, project) pair, or (None, None)."""
    if not _usable(key):
        return None, None
    now = connection.ops.adapt_datetimefield_value(timezone.now())
    with connection.cursor() as cursor:
        cursor.execute(_user_and_project_sql(), [name, digest_of(key), now])
        row = cursor.fetchone()
    if row is None:
        return None, None
    n = len(get_user_model()._meta.concrete_fields)
    user = _from_row(get_user_model(), row[:n])
    if not user.is_active:
        return None, None
    if row[n] is None:  # the project's id: no project of that name (the LEFT JOIN found none)
        return user, None
    project = _from_row(Project, row[n:-1])
    project.caller_role = row[-1]
    return user, project


def _from_row(model, values):
    """An instance of `model` from its concrete columns as the cursor gave them, converted as the
    ORM converts them (SQLite's datetimes come naive; PostgreSQL's need nothing for these tables)."""
    fields = model._meta.concrete_fields
    converted = []
    for field, value in zip(fields, values, strict=True):
        col = field.get_col(model._meta.db_table)
        for convert in connection.ops.get_db_converters(col) + field.get_db_converters(connection):
            value = convert(value, col, connection)
        converted.append(value)
    return model.from_db(connection.alias, [f.attname for f in fields], converted)


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
        # a project-scoped URL's project comes with the user (projects.services.access.project_for)
        name = ((getattr(request, "parser_context", None) or {}).get("kwargs") or {}).get("project")
        if isinstance(name, str) and NUL not in name:
            user, project = user_and_project_for_key(key, name)
            if user is not None:
                setattr(request, READ_WITH_CALLER, (name, project))
        else:
            user = user_for_key(key)
        if user is None:
            raise exceptions.AuthenticationFailed("invalid or expired token: make a new one with "
                                                  "`manage.py muster_token USERNAME`")
        return user, None

    def authenticate_header(self, request):
        return self.keyword
