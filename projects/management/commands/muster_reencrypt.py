"""Re-encrypt every stored secret and private key with the first MUSTER_ENCRYPTION_KEYS key."""

from cryptography.fernet import InvalidToken
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from dstack_api.models import UserSSHKey
from instances.models import Fleet, Instance
from muster import crypto
from projects.models import Secret
from runs.models import Run


def _rows():
    """(label, queryset, read, write) for every place an encrypted value is kept."""

    def column(field):
        return (lambda obj: getattr(obj, field)), (lambda obj, value: setattr(obj, field, value))

    def run_env():
        def read(run):
            return run.configuration.get("secret_env", "")

        def write(run, value):
            run.configuration["secret_env"] = value
        return read, write

    return [
        ("secret", Secret.objects.all(), *column("value_encrypted"), "value_encrypted"),
        ("fleet", Fleet.objects.exclude(private_key_encrypted=""), *column("private_key_encrypted"),
         "private_key_encrypted"),
        ("instance", Instance.objects.exclude(private_key_encrypted=""), *column("private_key_encrypted"),
         "private_key_encrypted"),
        ("run", Run.objects.filter(configuration__has_key="secret_env"), *run_env(), "configuration"),
        ("dstack key", UserSSHKey.objects.all(), *column("private_key_encrypted"), "private_key_encrypted"),
    ]


class Command(BaseCommand):
    help = ("Re-encrypt every stored secret value, SSH private key and run secret env with the first key of "
            "MUSTER_ENCRYPTION_KEYS, so older keys (and the legacy SECRET_KEY-derived one) can be dropped.")

    def handle(self, **options):
        unreadable, done = [], 0
        with transaction.atomic():
            for label, rows, read, write, field in _rows():
                for obj in rows.select_for_update().iterator():
                    old = read(obj)
                    if not old:
                        continue
                    try:
                        write(obj, crypto.reencrypt(old))
                    except InvalidToken:
                        unreadable.append(f"{label} {obj}")
                        continue
                    obj.save(update_fields=[field])
                    done += 1
        self.stdout.write(f"re-encrypted {done} values with the first key")
        if unreadable:
            raise CommandError("no configured key opens: " + ", ".join(unreadable) + " (left as they were; store "
                               "them again, or add the key they were made with to MUSTER_ENCRYPTION_KEYS)")
