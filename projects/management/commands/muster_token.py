from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from projects.models import Membership, Project, Role
from projects.services import tokens


class Command(BaseCommand):
    help = ("Create USERNAME if needed and print a new API token for it. The token is shown this once: "
            "only its hash is stored.")

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--project", help="also make the user a member of this project (created if needed)")
        parser.add_argument("--role", default=Role.ADMIN, choices=Role.values)
        parser.add_argument("--expires-in", type=float, metavar="DAYS", dest="expires_in",
                            help="days until the token stops working (default MUSTER_TOKEN_LIFETIME_DAYS; 0: never)")
        parser.add_argument("--revoke", action="store_true",
                            help="delete every token of the user first (e.g. one leaked); then print a new one")

    def handle(self, username, project=None, role=Role.ADMIN, expires_in=None, revoke=False, **options):
        user, _ = get_user_model().objects.get_or_create(username=username)
        if project:
            proj, _ = Project.objects.get_or_create(name=project)
            Membership.objects.update_or_create(project=proj, user=user, defaults={"role": role})
        if revoke:
            user.api_tokens.all().delete()
        _, key = tokens.issue(user, expires_in)
        self.stdout.write(key)
