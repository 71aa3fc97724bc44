"""Django's PBKDF2 hasher (same algorithm name, so stored hashes verify), counting every use."""

from django.contrib.auth.hashers import PBKDF2PasswordHasher

CALLS = {"count": 0}


class CountingPBKDF2PasswordHasher(PBKDF2PasswordHasher):
    def encode(self, password, salt, iterations=None):
        CALLS["count"] += 1
        return super().encode(password, salt, iterations)
