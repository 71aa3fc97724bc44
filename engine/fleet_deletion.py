"""Deleting a fleet, as a claimed step (`delete_fleet`).

`DELETE fleets/X` (instances/services/fleets.py) checks the fleet may go, ends its jobs when
forced, writes it `terminating` and sends `messages.delete_fleet`; it answers 202 without
touching a host. This step claims the terminating fleet, stops the runner agents on its hosts
(engine/groups.py `stop_agents`, the one fan-out that stops agents), ends its instances and
groups, and its Outcome's move removes the row (instances/transitions.py `remove_fleet`, guarded
by the lease). A second delivery finds the fleet claimed or gone and does nothing; a lost
message, or a worker that died here, leaves the fleet terminating and unleased, and the sweep
sends the message again. Stopping an agent that is gone already is a no-op, so doing the step
twice does no harm.
"""

from __future__ import annotations

from functools import partial

from engine import claims, groups
from instances.models import Fleet, FleetStatus
from instances.transitions import remove_fleet


def delete_fleet(fleet_id: int, actor: str = "server") -> bool:
    """Task body: stop and remove a terminating fleet's hosts, then the fleet; True when it went in this call."""
    held = claims.claimed(Fleet, fleet_id, "delete_fleet", partial(_delete, actor=actor),
                          status=FleetStatus.TERMINATING)
    return held is not None and fleet_id in held.applied


def _delete(held: claims.Held, actor: str) -> claims.Outcome:
    fleet = Fleet.objects.get(pk=held.pk)
    groups.terminate_fleet_instances(fleet, actor=actor)
    return claims.Outcome(move=partial(remove_fleet, fleet, actor=actor))
