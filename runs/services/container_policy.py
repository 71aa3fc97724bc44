"""Runs whose containers ask for more than the candidate fleets allow, refused at plan and submit.

A run with `privileged: true` or instance volumes (host paths) may only go to a fleet whose
operator allows them (runs/configuration/container_policy.py). When every fleet the run could use
(those named in `fleets:`, else every active fleet of the project) forbids it, no fleet could ever
take it: the run is refused with a 400 at `privileged` or `volumes[i]`, before anything is stored.
When some candidate allows it, placement sends the run only there.
"""

from __future__ import annotations

from instances import fitting
from projects.models import Project
from runs.configuration import ConfigurationError, TaskConfiguration
from runs.configuration.container_policy import fleet_policy, policy_problems


def check(project: Project, conf: TaskConfiguration) -> None:
    if not any(g.image for g in conf.groups):
        return
    fleets = fitting.fleets_for(project.pk, conf.fleets or [])
    found = []
    for fleet in fleets:
        problems = policy_problems(conf.container, fleet_policy(fleet.configuration, fleet.backend), fleet.name)
        if not problems:
            return
        found += problems
    if found:
        raise ConfigurationError([{"loc": loc, "msg": msg} for loc, msg in found])
