"""First-run setup used by `make run`: project `main`, an admin user, a local fleet, a token."""

import os
import secrets
import shlex
import sys
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.utils import timezone

from backends.registry import LOCAL_HOSTS
from instances.models import Fleet, Placement
from instances.services.fleets import create_local_fleet
from muster.files import write_private
from projects.models import Membership, Project, Role
from projects.services import tokens


class Command(BaseCommand):
    help = "Create project main, user admin (superuser) and a local fleet; print the token and URLs."

    def add_arguments(self, parser):
        parser.add_argument("--no-fleet", action="store_true")

    def handle(self, no_fleet=False, **options):
        project, _ = Project.objects.get_or_create(name="main")
        User = get_user_model()
        user = User.objects.filter(username="admin").first()
        password_path = settings.DATA_DIR / "admin_password"
        if user is None:
            password = secrets.token_urlsafe(12)
            user = User.objects.create_superuser("admin", password=password)
            write_private(password_path, password)
        Membership.objects.get_or_create(project=project, user=user, defaults={"role": Role.ADMIN})
        if not settings.MUSTER["LOCAL_BACKEND"]:
            no_fleet = True  # production without MUSTER_LOCAL_BACKEND: no shell on the control plane
        # the first fleet is named after its backend: this machine's hosts
        if not no_fleet and not Fleet.objects.filter(project=project, name=LOCAL_HOSTS).exists():
            create_local_fleet(project, LOCAL_HOSTS, settings.MUSTER["LOCAL_FLEET_SIZE"], placement=Placement.CLUSTER)
        # Only a token's hash is kept, so it is printed when made; later runs cannot show it again.
        live = user.api_tokens.exclude(expires__lte=timezone.now())
        if live.exists():
            shown = "(printed when it was made)"
        else:
            _, shown = tokens.issue(user)
        if password_path.exists():
            password = f"{password_path.read_text().strip()}  (kept in {password_path})"
        else:  # made by someone else (createsuperuser, muster_token): Muster never knew it
            password = f"(set outside Muster; `{manage_command('changepassword admin')}` sets a new one)"
        self.stdout.write(f"project: main\nadmin user: admin / {password}\ntoken: {shown}\n"
                          f"another token: {manage_command('muster_token admin')}")


def manage_command(args: str) -> str:
    """The whole command line that runs `manage.py ARGS` on this server's data, to paste as it is."""
    root = Path(__file__).resolve().parents[3]

    def shown(path: str) -> str:
        relative = os.path.relpath(path)
        return shlex.quote(path if relative.startswith("..") else relative)

    data = os.environ.get("MUSTER_DATA_DIR")
    prefix = f"MUSTER_DATA_DIR={shlex.quote(data)} " if data else ""
    return f"{prefix}{shown(sys.executable)} {shown(str(root / 'manage.py'))} {args}"
