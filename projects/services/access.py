"""Who may see and change what: every object hangs off a project the caller is a member of."""

from __future__ import annotations

from django.conf import settings
from django.http import Http404
from rest_framework.exceptions import PermissionDenied

from muster.api_errors import InvalidInput, NotAllowed
from muster.text import NUL
from projects import rows
from projects.models import Project, Role
from projects.services.caller_reads import project_read

WRITE_ROLES = (Role.ADMIN, Role.USER)
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


def named_or_404(queryset, what: str, project: Project, name: str):
    """The object of `queryset` called `name` in `project`, else a 404 that says which one was not
    found and where (Django's own says `No Run matches the given query.`)."""
    # a NUL cannot be in a stored name, and PostgreSQL refuses it in a query (muster/text.py)
    found = queryset.filter(project=project, name=name).first() if NUL not in name else None
    if found is None:
        raise Http404(f"{what} {name} not found in project {project.name}")
    return found


def project_for(request, name: str) -> Project:
    """The project named `name` if the caller belongs to it; 404 otherwise (never reveal it exists)."""
    user = request.user
    if NUL in name:
        raise Http404(f"project {name!r} not found")
    read = project_read(request, name)  # projects.services.tokens read it with the token's user
    project = read.project if read is not None else rows.project_with_role(name, user.pk if user.is_authenticated else None)
    if project is None:
        raise Http404(f"project {name} not found")
    if user.is_superuser:
        return project
    role = getattr(project, "caller_role", None)
    if role is None:
        raise Http404(f"project {name} not found")  # the same words as for none: never reveal it exists
    if request.method not in SAFE_METHODS and role not in WRITE_ROLES:
        raise PermissionDenied(f"your role in project {name} is {role}: it cannot change anything")
    return project


def require_admin(request, project: Project) -> None:
    if request.user.is_superuser:
        return
    role = project.caller_role if hasattr(project, "caller_role") else project.role_of(request.user)
    if role != Role.ADMIN:
        raise PermissionDenied(f"only admins of project {project.name} can do this")


class ProjectScopedMixin:
    """DRF view mixin: resolves `self.project` from the `project` URL kwarg before anything else."""

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)
        self.project = project_for(request, kwargs["project"])


def check_local_fleet(user, count: int) -> None:
    """A local instance is a directory and a process on the control plane's own machine, as the
    server's user: whoever runs a job there can read the database, the encryption keys and every
    token. So only superusers (who could do that anyway) may make one, and production turns the
    backend off unless the operator says otherwise (docs/security.md)."""
    if not settings.MUSTER["LOCAL_BACKEND"]:
        raise NotAllowed(["backends"], "the local backend is disabled on this server (MUSTER_ENV=production); "
                                       "an operator can enable it with MUSTER_LOCAL_BACKEND=1")
    if user is None or not user.is_superuser:
        raise NotAllowed(["backends"], "local fleets run commands on the control plane itself: only superusers "
                                       "may create them; use an ssh or gcp fleet")
    cap = int(settings.MUSTER["LOCAL_FLEET_MAX"])
    if count > cap:
        raise InvalidInput(["nodes"], f"a local fleet has at most {cap} instances (MUSTER_LOCAL_FLEET_MAX)")
