"""First-run setup used by `make run`: project `main`, an admin user, a local fleet, a token."""

import secrets

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.utils import timezone

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
        if not settings.MUSTER.get("LOCAL_BACKEND"):
            no_fleet = True  # production without MUSTER_LOCAL_BACKEND: no shell on the control plane
        if not no_fleet and not Fleet.objects.filter(project=project, name="local").exists():
            create_local_fleet(project, "local", settings.MUSTER["LOCAL_FLEET_SIZE"], placement=Placement.CLUSTER)
        # Only a token's hash is kept, so it is printed when made; later runs cannot show it again.
        live = user.api_tokens.exclude(expires__lte=timezone.now())
        if live.exists():
            shown = "(printed when it was made; `manage.py muster_token admin` makes another)"
        else:
            _, shown = tokens.issue(user)
        password = password_path.read_text().strip() if password_path.exists() else "(set earlier)"
        self.stdout.write(f"project: main\nadmin user: admin / {password}\ntoken: {shown}")
