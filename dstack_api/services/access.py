"""Who may call what: dstack's calls are all POSTs, so each is checked as the native API checks the
same action (a read as a GET, a change as a POST) by Muster's own project_for."""

from __future__ import annotations

from types import SimpleNamespace

from django.http import Http404
from rest_framework import authentication

from dstack_api.services.errors import DstackError, NotFound
from projects.models import Membership, Project, Role
from projects.services import access
from projects.services.tokens import TokenAuthentication

# the newest client this layer speaks to (dstack refuses a client newer than itself the same way)
API_VERSION = "0.22.5"
WRITE_ROLES = access.WRITE_ROLES


class BearerAuthentication(TokenAuthentication):
    """Muster's API tokens, sent as dstack's client sends them: `Authorization: Bearer <key>`."""

    keyword = "Bearer"


class MissingCredentials(authentication.BaseAuthentication):
    """Authenticates nobody: its header makes a missing token a 401 in DRF, answered as dstack does."""

    def authenticate(self, request):
        return None

    def authenticate_header(self, request):
        return "Bearer"


def project_for(request, name: str, change: bool) -> Project:
    # dstack's calls are all POSTs: whether this one changes anything is `change`; the project the
    # token's authentication read with the user (projects.services.tokens) comes along
    as_native = SimpleNamespace(user=request.user, method="POST" if change else "GET", auth=request.auth)
    try:
        return access.project_for(as_native, name)
    except Http404:
        raise NotFound(f"Project {name} not found") from None


def dstack_role(role: str | None, superuser: bool) -> str:
    """dstack has admin, manager and user; a read-only member is a `user` there and is still refused
    every change by Muster."""
    if superuser or role == Role.ADMIN:
        return "admin"
    return "user"


def members_of(project: Project):
    return Membership.objects.filter(project=project).select_related("user").order_by("user__username")


def _version(text: str) -> tuple[int, ...] | None:
    try:
        return tuple(int(p) for p in text.split(".")[:3])
    except ValueError:
        return None


def check_client_version(header: str | None) -> None:
    """dstack's rule: a client of a newer minor version than the server is refused with its own
    message; no header or an unparsable one (a development build) passes."""
    if not header:
        return
    client, server = _version(header.strip()), _version(API_VERSION)
    if client is None or server is None or len(client) < 2:
        return
    if client[:2] > server[:2]:
        raise DstackError(f"The client/CLI version ({header.strip()}) is incompatible with the server version "
                          f"({API_VERSION}).")
