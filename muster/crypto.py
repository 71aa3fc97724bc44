"""Encryption at rest for SSH private keys and secret values.

The key is derived from SECRET_KEY, so a database dump alone does not reveal them.
"""

from __future__ import annotations

import base64
import hashlib
from functools import lru_cache

from cryptography.fernet import Fernet
from django.conf import settings


@lru_cache(maxsize=4)
def _fernet(secret_key: str) -> Fernet:
    digest = hashlib.sha256(("muster-at-rest:" + secret_key).encode()).digest()
    return Fernet(base64.urlsafe_b64encode(digest))


def encrypt(plaintext: str) -> str:
    if not plaintext:
        return ""
    return _fernet(settings.SECRET_KEY).encrypt(plaintext.encode()).decode()


def decrypt(token: str) -> str:
    if not token:
        return ""
    return _fernet(settings.SECRET_KEY).decrypt(token.encode()).decode()
