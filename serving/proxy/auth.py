"""Who may use a service with `auth: true`: a member of its project (any role), or a superuser,
as the API decides it (projects.services.access.project_for), by the same token check the API
makes (projects.services.tokens: the key's SHA-256 digest looked up, expiry and the user's
active flag honoured).

A verdict is kept AUTH_CACHE seconds (MUSTER_ENDPOINT_AUTH_CACHE) per token and project, so a
revoked token, an expired one or a removed member is refused within those seconds; a stream of
requests costs one database read per token and project every few seconds, not one per request.
Only the digest is kept, never the key.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

OK, INVALID, NOT_MEMBER = "ok", "invalid", "not a member"
MAX_CACHED = 50_000


def bearer(header: str) -> str | None:
    """The key of `Authorization: Bearer <key>` (or the API's `Token <key>`); None for anything else."""
    scheme, _, key = header.strip().partition(" ")
    key = key.strip()
    if scheme.lower() not in ("bearer", "token") or not key or " " in key:
        return None
    return key


def verdict(key: str, project: str) -> str:
    """The check itself (synchronous: the ORM), in one read as the API's token authentication does."""
    from projects.services.tokens import user_and_project_for_key
    from serving.proxy import database

    user, found = database.read(user_and_project_for_key, key, project)
    if user is None:
        return INVALID
    if user.is_superuser or (found is not None and getattr(found, "caller_role", None) is not None):
        return OK
    return NOT_MEMBER


class TokenCheck:
    def __init__(self, executor: ThreadPoolExecutor, keep: float):
        self._executor, self._keep = executor, keep
        self._cache: dict[tuple[str, str], tuple[str, float]] = {}

    async def check(self, key: str, project: str) -> str:
        from projects.services.tokens import digest_of

        cache_key = (digest_of(key), project)
        now = time.monotonic()
        cached = self._cache.get(cache_key)
        if cached is not None and cached[1] > now:
            return cached[0]
        result = await asyncio.get_running_loop().run_in_executor(self._executor, verdict, key, project)
        if len(self._cache) >= MAX_CACHED:
            self._cache = {k: v for k, v in self._cache.items() if v[1] > now}
            if len(self._cache) >= MAX_CACHED:
                self._cache.clear()
        self._cache[cache_key] = (result, now + self._keep)
        return result
