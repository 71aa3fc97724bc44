"""Who loses access loses their attach keys: whichever way it happens (the admin, the ORM, a
management command), the rows that give access going away or the user turned off marks that
user's attach grants due (runs/services/attach.py), and a worker takes the lines off the hosts."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.db.models.signals import post_delete, post_save, pre_delete

from projects.models import ApiToken, Membership
from runs.services import attach


def _member_left(sender, instance: Membership, **kwargs) -> None:
    attach.revoke_for(instance.user_id, instance.project_id)


def _token_gone(sender, instance: ApiToken, **kwargs) -> None:
    # the CLI attaches with a token: with none left the user has no way back in
    if not ApiToken.objects.filter(user_id=instance.user_id).exists():
        attach.revoke_for(instance.user_id)


def _user_saved(sender, instance, **kwargs) -> None:
    if not instance.is_active:
        attach.revoke_for(instance.pk)


def _user_deleted(sender, instance, **kwargs) -> None:
    attach.revoke_for(instance.pk)  # before the delete: the grants keep their rows (user = NULL)


def connect() -> None:
    user = get_user_model()
    post_delete.connect(_member_left, sender=Membership, dispatch_uid="attach-member-left")
    post_delete.connect(_token_gone, sender=ApiToken, dispatch_uid="attach-token-gone")
    post_save.connect(_user_saved, sender=user, dispatch_uid="attach-user-saved")
    pre_delete.connect(_user_deleted, sender=user, dispatch_uid="attach-user-deleted")
