from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from rest_framework.authtoken.models import Token

from projects.models import Membership, Project, Role


class Command(BaseCommand):
    help = "Create USERNAME if needed and print an API token for it."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--project", help="also make the user a member of this project (created if needed)")
        parser.add_argument("--role", default=Role.ADMIN, choices=Role.values)

    def handle(self, username, project=None, role=Role.ADMIN, **options):
        user, _ = get_user_model().objects.get_or_create(username=username)
        if project:
            proj, _ = Project.objects.get_or_create(name=project)
            Membership.objects.update_or_create(project=proj, user=user, defaults={"role": role})
        token, _ = Token.objects.get_or_create(user=user)
        self.stdout.write(token.key)
