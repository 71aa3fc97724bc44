"""The endpoint's request counts per service (serving.models.ServiceStats)."""

from __future__ import annotations

from django.db import IntegrityError, transaction
from django.db.models import F

from serving.models import ServiceStats


def add_requests(run_id: int, count: int) -> None:
    """Add one endpoint process's count to a service's total (the row is made on first use)."""
    if count <= 0:
        return
    if ServiceStats.objects.filter(run_id=run_id).update(requests=F("requests") + count):
        return
    try:
        with transaction.atomic():
            ServiceStats.objects.create(run_id=run_id, requests=count)
    except IntegrityError:  # another endpoint process made it first
        ServiceStats.objects.filter(run_id=run_id).update(requests=F("requests") + count)


def requests_total(run_id: int) -> int:
    """Every request the endpoint processes counted for the service so far (0 before the first)."""
    return ServiceStats.objects.filter(run_id=run_id).values_list("requests", flat=True).first() or 0
