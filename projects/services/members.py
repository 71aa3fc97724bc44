"""Project members: adding them by username, listing them, and a user's own memberships.

Adding a username answers the same whether an account of that name exists: anyone can create a
project and add members to it, so a different answer (or a different member list) would let any
user enumerate the server's accounts. A username with no account is kept as a PendingMembership
and becomes a membership when the account is created. Whoever was added sees the project in
their memberships and may leave it: nobody is kept in a project against their will.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.db import transaction
from django.http import Http404

from projects.models import Membership, PendingMembership, Project


def add_member(project: Project, username: str, role: str) -> None:
    user = get_user_model().objects.filter(username=username).first()
    if user is not None:
        Membership.objects.update_or_create(project=project, user=user, defaults={"role": role})
        return
    PendingMembership.objects.update_or_create(project=project, username=username, defaults={"role": role})
    # the account may have been created between the lookup and the insert, its claim finding nothing
    late = get_user_model().objects.filter(username=username).first()
    if late is not None:
        claim_pending(late)


def member_rows(memberships, pending) -> list[dict]:
    """{"username", "role"} of every member, with an account or not yet, in username order; the
    two read alike."""
    rows = [{"username": m.user.username, "role": m.role} for m in memberships]
    rows += [{"username": p.username, "role": p.role} for p in pending]
    return sorted(rows, key=lambda r: r["username"])


def claim_pending(user) -> None:
    """Turn the pending memberships of `user`'s username into memberships (a new account)."""
    with transaction.atomic():
        for pending in PendingMembership.objects.select_for_update().filter(username=user.get_username()):
            Membership.objects.get_or_create(project=pending.project, user=user, defaults={"role": pending.role})
            pending.delete()


def memberships_of(user) -> list[dict]:
    rows = Membership.objects.filter(user=user).select_related("project").order_by("project__name")
    return [{"project": m.project.name, "role": m.role} for m in rows]


def leave(user, project_name: str) -> None:
    """End `user`'s membership of the project; 404 when there is none (as for a project that does
    not exist). A project whose last admin leaves is managed by a superuser."""
    if not Membership.objects.filter(user=user, project__name=project_name).delete()[0]:
        raise Http404("you are not a member of this project")


def on_user_saved(sender, instance, created: bool, raw: bool = False, **kwargs) -> None:
    """post_save of the user model (connected in ProjectsConfig.ready): however an account is made
    (muster_token, the admin, createsuperuser), the memberships waiting for its name are its."""
    if created and not raw:
        claim_pending(instance)
