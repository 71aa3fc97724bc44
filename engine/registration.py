"""Registering an SSH fleet, as a claimed step (`register_fleet`).

Applying an SSH fleet writes it `pending` and sends `messages.register_fleet`. The step claims the
pending fleet, contacts, probes and starts the runner on every host, and activates or fails the
fleet (the rules: engine/ssh_registration.py), then gives the fleet back; nothing is sent
after it. A second delivery finds the fleet claimed or no longer pending and does nothing. A lost
message, a worker that died mid-registration or an unexpected exception leaves the fleet pending
and unleased (after a backoff), and the sweep sends the message again; the next registration
converges on what the last one left on the hosts (the same host keys, the runner agents it
started found running and kept).
"""

from __future__ import annotations

from functools import partial

from django.conf import settings
from django.utils import timezone

from backends.registry import GIVEN_HOSTS
from engine import claims
from instances.models import Fleet, FleetStatus

# Retries of a registration that keeps hitting an unexpected error stop here, so the user's hosts
# are not contacted for ever and `muster fleet apply` (which waits 15 min) sees the failure.


def give_up_after() -> float:
    return float(settings.MUSTER["SSH_REGISTER_GIVE_UP"])


def register_fleet(fleet_id: int, actor: str = "server") -> bool:
    """Task body: register a pending SSH fleet's hosts; False when it was not ours to register."""
    held = claims.claimed(Fleet, fleet_id, "register_fleet", partial(_register, actor=actor),
                          status=FleetStatus.PENDING, backend=GIVEN_HOSTS)
    # None: registered already (a second delivery), being registered, or deleted
    return held is not None and not held.failed and held.outcome is not _GONE


def _register(held: claims.Held, actor: str) -> claims.Outcome:
    # Imported here, not at the top: every process that sends an engine message imports
    # engine.tasks and so this module (engine/messages.py looks tasks up in Celery's registry),
    # and the registration's rules bring paramiko with them (about 60 ms a process).
    from engine import ssh_registration

    fleet = Fleet.objects.select_related("project").filter(pk=held.pk).first()
    if fleet is None:
        return _GONE  # deleted since the claim
    limit = give_up_after()
    if (timezone.now() - fleet.created).total_seconds() > limit:
        return ssh_registration.give_up(fleet, f"registration did not complete within {limit:g} s (the server "
                                        "failed unexpectedly on every try; see its log): apply the fleet again", actor)
    # The fleet's move (active or failed) is the outcome's: written under the claim once the hosts answered.
    return ssh_registration.complete_registration(fleet, actor=actor)


# the fleet went away: given back as it is (nothing to), and the step says it did not register
_GONE = claims.Outcome()
