"""The claim protocol every task and sweep uses.

A worker owns a row while `lease_until` is in the future and `lease_token` is its token. Claiming
is one conditional UPDATE that must touch exactly one row (portable to SQLite, where it runs in an
IMMEDIATE transaction); on PostgreSQL the candidate row is first locked with
`SELECT ... FOR UPDATE SKIP LOCKED`, so concurrent workers skip each other instead of queueing.
A worker that dies simply lets its lease expire, and the next sweep claims the row again.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

from django.conf import settings
from django.db import connection, models, transaction
from django.db.models import Q
from django.utils import timezone


class Claimable(models.Model):
    lease_until = models.DateTimeField(null=True, blank=True, db_index=True)
    lease_token = models.CharField(max_length=32, blank=True, default="")

    class Meta:
        abstract = True


def lease_seconds() -> float:
    return float(settings.MUSTER["LEASE_SECONDS"])


def unleased(now=None) -> Q:
    now = now or timezone.now()
    return Q(lease_until__isnull=True) | Q(lease_until__lt=now)


def claim(model: type[models.Model], pk, seconds: float | None = None, **conditions) -> str | None:
    """Claim row `pk` if it matches `conditions` and nobody holds it; return the token or None."""
    now = timezone.now()
    token = uuid.uuid4().hex
    until = now + timedelta(seconds=seconds if seconds is not None else lease_seconds())
    with transaction.atomic():
        qs = model.objects.filter(unleased(now), pk=pk, **conditions)
        if connection.features.has_select_for_update_skip_locked:
            if not list(qs.select_for_update(skip_locked=True).values_list("pk", flat=True)):
                return None
        touched = qs.update(lease_until=until, lease_token=token)
    return token if touched == 1 else None


def release(model: type[models.Model], pk, token: str, **updates) -> bool:
    """Give the row back, applying `updates` only if we still hold it."""
    touched = model.objects.filter(pk=pk, lease_token=token).update(lease_until=None, lease_token="", **updates)
    return touched == 1


def claim_batch(queryset, limit: int, seconds: float | None = None) -> tuple[str, list]:
    """Claim up to `limit` unleased rows of `queryset` at once (sweeps); returns (token, pks)."""
    now = timezone.now()
    token = uuid.uuid4().hex
    until = now + timedelta(seconds=seconds if seconds is not None else lease_seconds())
    with transaction.atomic():
        qs = queryset.filter(unleased(now)).order_by("pk")
        if connection.features.has_select_for_update_skip_locked:
            qs = qs.select_for_update(skip_locked=True)
        pks = list(qs.values_list("pk", flat=True)[:limit])
        if pks:
            queryset.model.objects.filter(unleased(now), pk__in=pks).update(lease_until=until, lease_token=token)
    return token, list(queryset.model.objects.filter(pk__in=pks, lease_token=token).values_list("pk", flat=True))
