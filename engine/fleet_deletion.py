"""Deleting a fleet, as a claimed step (`delete_fleet`).

`DELETE fleets/X` (instances/services/fleets.py) checks the fleet may go, ends its jobs when
forced, writes it `terminating` and sends `messages.delete_fleet`; it answers 202 without
touching a host. This step claims the terminating fleet, stops the runner agents on its hosts
(engine/groups.py `stop_agents`, the one fan-out that stops agents), ends its instances and
groups, and removes the row. A second delivery finds the fleet claimed or gone and does nothing;
a lost message, or a worker that died here, leaves the fleet terminating and unleased, and the
sweep sends the message again. Stopping an agent that is gone already is a no-op, so doing the
step twice does no harm.
"""

from __future__ import annotations

from django.db import transaction

from engine import claims, groups
from events.services import record
from instances.models import Fleet, FleetStatus


def delete_fleet(fleet_id: int, actor: str = "server") -> bool:
    """Task body: stop and remove a terminating fleet's hosts, then the fleet; False when it was not ours."""
    with claims.claimed(Fleet, fleet_id, "delete_fleet", status=FleetStatus.TERMINATING) as held:
        if held is None:
            return False  # deleted already (a second delivery), or being deleted
        fleet = Fleet.objects.filter(pk=fleet_id).first()
        if fleet is None:
            return False
        groups.terminate_fleet_instances(fleet, actor=actor)
        with transaction.atomic():
            record(fleet.project_id, f"fleet {fleet.name}", "deleted", actor=actor)
            fleet.delete()
    return not held.failed
