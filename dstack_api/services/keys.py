"""Each user's dstack SSH keypair: made by Muster the first time the user's client asks for it.

dstack's client downloads the private key (`users/get_my_user`) to reach its jobs over SSH; it is
the user's own key (returned only to that user), never a host's or a fleet's key.
"""

from __future__ import annotations

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.db import IntegrityError, transaction

from dstack_api.models import UserSSHKey


def _new_keypair(comment: str) -> tuple[str, str]:
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption()).decode()
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return f"{public.decode()} {comment}", private


def keypair_of(user) -> UserSSHKey:
    found = UserSSHKey.objects.filter(user=user).first()
    if found is not None:
        return found
    public, private = _new_keypair(f"{user.username}@muster")
    made = UserSSHKey(user=user, public_key=public)
    made.private_key = private
    try:
        with transaction.atomic():
            made.save()
    except IntegrityError:  # two first calls at once: the other one made it
        return UserSSHKey.objects.get(user=user)
    return made


def public_key_of(user) -> str:
    return keypair_of(user).public_key
