"""A batch's jobs with their hosts' fleets and slices in place, each read once for the batch.

Joined to every job's row, a fleet of a thousand busy hosts was a thousand copies of one row, its
configuration's JSON decoded each time: an SSH fleet's lists every host (instances/services/
ssh_fleets.py). The batch steps (the watch, the finish of a burst of ended jobs) read the jobs with
their hosts, then the hosts' fleets and groups once each here.
"""

from __future__ import annotations

from instances.models import Fleet, InstanceGroup
from runs.models import Job


def with_fleets(jobs: list[Job]) -> list[Job]:
    """`jobs`, each host's `fleet` and `group` set from one read of each table."""
    hosts = [job.instance for job in jobs if job.instance is not None]
    fleets = Fleet.objects.defer("errors").in_bulk({h.fleet_id for h in hosts if h.fleet_id is not None})
    groups = InstanceGroup.objects.in_bulk({h.group_id for h in hosts if h.group_id is not None})
    for host in hosts:
        if host.fleet_id in fleets:
            host.fleet = fleets[host.fleet_id]
        if host.group_id in groups:
            host.group = groups[host.group_id]
    return jobs
