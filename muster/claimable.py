"""The lease columns every claimed row carries, how a write guards by them and releases them, and
the signal a lost claim sends (engine/claims.py is the protocol that uses them).

Here, below the apps, so that a model can be claimable, a transition function can take a step's
lease (`lease=`), and /metrics can count lost claims (console/taskstats.py), without importing the
engine (tests/test_import_graph.py). The lease columns are named only here, in engine/claims.py and
in engine/locked_claims.py (the protocol's own statements); tests/test_lease_writes.py holds that.
"""

from dataclasses import dataclass

from django.db import models
from django.db.models import Q
from django.dispatch import Signal
from django.utils import timezone

# sent with the model as sender when a claim lost to another holder of the row
claim_conflict = Signal()

LEASE_FIELDS = ("lease_until", "lease_token")


class Claimable(models.Model):
    lease_until = models.DateTimeField(null=True, blank=True, db_index=True)
    lease_token = models.CharField(max_length=32, blank=True, default="")

    class Meta:
        abstract = True


def unleased(now=None) -> Q:
    """The rows nobody holds: no lease, or one that ran out."""
    now = now or timezone.now()
    return Q(lease_until__isnull=True) | Q(lease_until__lt=now)


def lease_guard(token: str) -> dict:
    """The filter of a write that must touch a row only while `token` still holds it."""
    return {"lease_token": token}


def leased(queryset, token: str):
    """The rows of `queryset` `token` still holds (a batch step reading the rows it claimed)."""
    return queryset.filter(**lease_guard(token))


def released(until=None) -> dict:
    """The fields a give-back writes: nobody holds the row. `until`: the lease runs on with nobody's
    token until then, so no claim takes the row before (a backoff)."""
    return {"lease_until": until, "lease_token": ""}


@dataclass(frozen=True)
class Lease:
    """A step's hold on one row, handed to the row's transition function (`lease=`): the move's UPDATE
    is guarded by pk + token + status. `ends`: the move is the step's give-back (an Outcome's `move`,
    called by engine/claims.give_back), so the same UPDATE clears the lease."""

    token: str
    ends: bool = False

    def guard(self) -> dict:
        return lease_guard(self.token)

    def written(self) -> dict:
        return released() if self.ends else {}


def guard_of(lease: "Lease | None") -> dict:
    return lease.guard() if lease is not None else {}


def written_by(lease: "Lease | None") -> dict:
    return lease.written() if lease is not None else {}
