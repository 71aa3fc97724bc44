"""The lease columns every claimed row carries, and the signal a lost claim sends (engine/claims.py
is the protocol that uses them).

Here, below the apps, so that a model can be claimable, and /metrics can count lost claims
(console/taskstats.py), without importing the engine (tests/test_import_graph.py).
"""

from django.db import models
from django.db.models import Q
from django.dispatch import Signal
from django.utils import timezone

# sent with the model as sender when a claim lost to another holder of the row
claim_conflict = Signal()


class Claimable(models.Model):
    lease_until = models.DateTimeField(null=True, blank=True, db_index=True)
    lease_token = models.CharField(max_length=32, blank=True, default="")

    class Meta:
        abstract = True


def unleased(now=None) -> Q:
    """The rows nobody holds: no lease, or one that ran out."""
    now = now or timezone.now()
    return Q(lease_until__isnull=True) | Q(lease_until__lt=now)
