"""A group's own `fleets:` checked against the project at plan and submit: a name the project has
no fleet of is a 400 at `groups[i].fleets[j]`, before anything is stored (a task-level name that
matches nothing is a capacity answer instead, as it always was: the fleet may be created later,
but a group that names one explicitly has made its choice)."""

from __future__ import annotations

from instances import fitting
from instances.models import Fleet, FleetStatus
from projects.models import Project
from runs.configuration import ConfigurationError, TaskConfiguration


def check(project: Project, conf: TaskConfiguration) -> None:
    named = {name for g in conf.groups for name in g.fleets}
    if not named:
        return
    known = set(Fleet.objects.filter(project=project, name__in=named).exclude(status=FleetStatus.TERMINATING)
                .values_list("name", flat=True))
    if any("/" in name for name in named):  # `owner/name`: another project's fleet shared with this one
        known |= {fitting.written_name(f) for f in fitting.shared_fleets(project.pk, [n for n in named if "/" in n])}
    errors = [{"loc": ["groups", g.index, "fleets", f],
               "msg": f"the project has no fleet named `{name}`: create it first or name one of the project's fleets"}
              for g in conf.groups for f, name in enumerate(g.fleets) if name not in known]
    if errors:
        raise ConfigurationError(errors)
