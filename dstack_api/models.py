from __future__ import annotations

from django.conf import settings
from django.db import models

from muster import crypto


class UserSSHKey(models.Model):
    """The SSH keypair dstack's client expects each user to have (`users/get_my_user`). Made by
    Muster for the user, never a host's key; the private half is encrypted at rest."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="dstack_key")
    public_key = models.TextField()
    private_key_encrypted = models.TextField()
    created = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"dstack key of {self.user}"

    @property
    def private_key(self) -> str:
        return crypto.decrypt(self.private_key_encrypted, loc=["users", "ssh_private_key"],
                              what=f"the dstack SSH key of {self.user}",
                              fix="an operator deletes the key in the admin and a new one is made")

    @private_key.setter
    def private_key(self, plaintext: str) -> None:
        self.private_key_encrypted = crypto.encrypt(plaintext)
