"""The server's own keys, read from the environment or made once into the data directory (0600):
SECRET_KEY for Django's signing, and the Fernet keys for data at rest. Production must be given both."""

from __future__ import annotations

import secrets
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from muster.env import env_str
from muster.files import read_or_create_private


def secret_key(production: bool, data_dir: Path) -> str:
    key = env_str("SECRET_KEY")
    if key:
        return key
    if production:
        raise ImproperlyConfigured("SECRET_KEY must be set in the environment when MUSTER_ENV=production")
    return read_or_create_private(data_dir / "secret_key", lambda: secrets.token_urlsafe(50))


def encryption_keys(production: bool, data_dir: Path) -> list[str]:
    """Fernet keys for data at rest (muster/crypto.py), first one encrypting; not SECRET_KEY, so
    rotating either never makes the other's data unreadable."""
    from cryptography.fernet import Fernet

    keys = [k.strip() for k in env_str("MUSTER_ENCRYPTION_KEYS").split(",") if k.strip()]
    if not keys:
        if production:
            raise ImproperlyConfigured(
                "MUSTER_ENCRYPTION_KEYS must be set when MUSTER_ENV=production (comma-separated Fernet keys; make "
                "one with: python -c 'from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())')")
        keys = [read_or_create_private(data_dir / "encryption_key", lambda: Fernet.generate_key().decode())]
    for i, key in enumerate(keys):
        try:
            Fernet(key)
        except ValueError:
            raise ImproperlyConfigured(f"MUSTER_ENCRYPTION_KEYS: key {i + 1} is not a Fernet key (32 url-safe "
                                       "base64-encoded bytes)") from None
    return keys
