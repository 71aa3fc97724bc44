"""Runs with `image` and the local backend, checked when they are planned and submitted.

A local fleet runs its jobs on the server's own machine, so whether it can run a job with
`image` is whether that machine's Docker answers. At plan and at submit of a run with `image`
whose candidate fleets (those named in `fleets:`, else every active fleet of the project)
include local ones, the machine's Docker is asked once (`docker info`, backends/local/host.py)
and the answer is recorded on those fleets' instances (instances/docker_facts.py), so placement
uses what is true now, not what was true when the fleet was made.

When Docker does not answer and every candidate fleet is local, no fleet could ever take the
run: it is refused with a 400 naming `image` (or `groups[i].image`) and the fix, before anything
is stored. When another fleet (SSH or cloud) is among the candidates, the run is planned as any
other: it goes to a fleet that fits, or the plan's capacity says per fleet why none does.
"""

from __future__ import annotations

from backends.registry import LOCAL_HOSTS, local_docker
from instances import docker_facts, fitting
from instances.models import Instance, InstanceStatus
from projects.models import Project
from runs.configuration import ConfigurationError, TaskConfiguration


def check(project: Project, conf: TaskConfiguration) -> None:
    """Record the local machine's Docker on the candidate local fleets; raise ConfigurationError
    (a 400) when it does not answer and only local fleets could take the run."""
    groups = [g for g in conf.groups if g.image]
    if not groups:
        return
    fleets = fitting.fleets_for(project.pk, conf.fleets or [])
    local = [f for f in fleets if f.backend == LOCAL_HOSTS]
    if not local:
        return
    found = local_docker()
    for inst in Instance.objects.filter(fleet__in=local).exclude(
            status__in=[InstanceStatus.TERMINATING, InstanceStatus.TERMINATED]).only(
            "pk", "name", "project_id", "status", "resources", "backend_data"):
        if (inst.resources or {}).get("docker") != found:  # a plan writes (and locks) only on a change
            docker_facts.store(inst, found)
    if found is not None or len(local) < len(fleets):
        return
    names = ", ".join(f.name for f in local)
    what = f"local fleet {names}" if len(local) == 1 else f"local fleets {names}"
    msg = (f"the {what} runs jobs on the server's machine, where Docker does not answer (`docker info` failed), "
           "so a job with an image cannot run there: install Docker on that machine and start it, or remove "
           "`image` to run the commands on the host, or name a fleet whose hosts have Docker in `fleets`")
    locs: list[list[str | int]] = []
    for group in groups:
        loc: list[str | int] = ["image"] if not conf.uses_groups or group.image == conf.image else [
            "groups", group.index, "image"]
        if loc not in locs:
            locs.append(loc)
    raise ConfigurationError([{"loc": loc, "msg": msg} for loc in locs])
