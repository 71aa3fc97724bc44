"""Encryption at rest for SSH private keys and secret values.

Keys come from MUSTER_ENCRYPTION_KEYS (a list, independent of SECRET_KEY): the first encrypts,
every one decrypts, so rotating is "put a new key first, run `manage.py muster_reencrypt`, drop
the old one". Values written before these keys existed were encrypted with a key derived from
SECRET_KEY; that key stays a decrypt-only key so an upgrade loses nothing (docs/security.md).
"""

from __future__ import annotations

import base64
import hashlib
from functools import lru_cache

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings


class DecryptError(Exception):
    """A stored value none of the configured keys opens; `errors` is the API's error shape."""

    status_code = 409  # the request is fine; the server's keys no longer match what it stored

    def __init__(self, loc: list, what: str, fix: str):
        msg = (f"{what} cannot be decrypted with this server's keys (MUSTER_ENCRYPTION_KEYS): the key it was "
               f"stored with is no longer configured; {fix}")
        super().__init__(msg)
        self.loc, self.what, self.fix = loc, what, fix
        self.errors = [{"loc": loc, "msg": msg}]

    def __reduce__(self):  # Celery pickles a task's exception to report it
        return (type(self), (self.loc, self.what, self.fix))


def legacy_key(secret_key: str) -> bytes:
    """The key every value was encrypted with before MUSTER_ENCRYPTION_KEYS: derived from SECRET_KEY."""
    return base64.urlsafe_b64encode(hashlib.sha256(("muster-at-rest:" + secret_key).encode()).digest())


@lru_cache(maxsize=8)
def _fernet(keys: tuple[str, ...], secret_key: str) -> MultiFernet:
    return MultiFernet([Fernet(k) for k in keys] + [Fernet(legacy_key(secret_key))])


def _current() -> MultiFernet:
    return _fernet(tuple(settings.MUSTER_ENCRYPTION_KEYS), settings.SECRET_KEY)


def encrypt(plaintext: str) -> str:
    if not plaintext:
        return ""
    return _current().encrypt(plaintext.encode()).decode()


def decrypt(token: str, loc: list | None = None, what: str = "a stored value", fix: str = "store it again") -> str:
    if not token:
        return ""
    try:
        return _current().decrypt(token.encode()).decode()
    except InvalidToken:
        raise DecryptError(loc or [], what, fix) from None


def reencrypt(token: str) -> str:
    """`token` encrypted again with the first key (unchanged if empty); raises InvalidToken if unreadable."""
    if not token:
        return ""
    return _current().rotate(token.encode()).decode()
