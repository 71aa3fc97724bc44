from __future__ import annotations

from collections.abc import Iterator, Mapping

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models

from muster import crypto

slug_validator = RegexValidator(r"^[a-z0-9][a-z0-9-]{0,62}$", "lowercase letters, digits and dashes")


class Role(models.TextChoices):
    ADMIN = "admin"
    USER = "user"
    READ_ONLY = "read-only"


class Project(models.Model):
    name = models.CharField(max_length=63, unique=True, validators=[slug_validator])
    created = models.DateTimeField(auto_now_add=True)
    # Set by an operator in the admin (project admins may not raise their own): empty takes
    # MUSTER_LOG_QUOTA, 0 is no quota (runs/log_storage.py).
    log_quota = models.BigIntegerField(
        null=True, blank=True, help_text="bytes of finished jobs' logs the server keeps for this project; "
                                         "empty: MUSTER_LOG_QUOTA; 0: no quota")

    def __str__(self) -> str:
        return self.name

    def role_of(self, user) -> str | None:
        if not user or not user.is_authenticated:
            return None
        member = self.memberships.filter(user=user).first()
        return member.role if member else None

    def secret_values(self) -> dict[str, str]:
        return {s.name: s.value for s in self.secrets.all()}

    def lazy_secret_values(self) -> Mapping[str, str]:
        """The secrets, read (and decrypted) only when a bare env key asks for one."""
        return LazySecrets(self)


class LazySecrets(Mapping):
    def __init__(self, project: Project):
        self._project, self._values = project, None

    def _load(self) -> dict[str, str]:
        if self._values is None:
            self._values = self._project.secret_values()
        return self._values

    def __getitem__(self, key: str) -> str:
        return self._load()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._load())

    def __len__(self) -> int:
        return len(self._load())


class Membership(models.Model):
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.USER)

    class Meta:
        unique_together = [("project", "user")]

    def __str__(self) -> str:
        return f"{self.user} in {self.project} ({self.role})"


class PendingMembership(models.Model):
    """A member added by a username no account has (yet): it becomes a Membership when an account
    of that name is created (projects.services.members.claim_pending). Kept so that adding and
    listing members answer the same whether the username exists, which would otherwise be an oracle
    for the accounts on the server."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="pending_memberships")
    username = models.CharField(max_length=150)
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.USER)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        unique_together = [("project", "username")]

    def __str__(self) -> str:
        return f"{self.username} (no account yet) in {self.project} ({self.role})"


class Secret(models.Model):
    """A project secret; the value is stored encrypted and never returned by the API."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="secrets")
    name = models.CharField(max_length=128)
    value_encrypted = models.TextField()
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        unique_together = [("project", "name")]

    def __str__(self) -> str:
        return self.name

    @property
    def value(self) -> str:
        try:
            return crypto.decrypt(self.value_encrypted)
        except crypto.DecryptError:
            # named here, not before: self.project costs a query that only a failure needs
            raise crypto.DecryptError(["secrets", self.name], f"secret {self.name}",
                                      f"set it again (POST /api/projects/{self.project.name}/secrets/)") from None

    @value.setter
    def value(self, plaintext: str) -> None:
        self.value_encrypted = crypto.encrypt(plaintext)


class ApiToken(models.Model):
    """An API token, kept as its SHA-256 only: a database dump gives nobody a way in.

    The key is 256 random bits, so a plain hash is enough (no slow KDF: nothing to brute-force).
    `prefix` is the key's first characters, kept to tell a user's tokens apart in the admin.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    prefix = models.CharField(max_length=12)
    digest = models.CharField(max_length=64, unique=True)
    created = models.DateTimeField(auto_now_add=True)
    expires = models.DateTimeField(null=True, blank=True, help_text="empty: never")

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user})"
