"""One machine sits in one live SSH fleet: the check the apply makes before any login
(instances/services/ssh_fleets.py) and the registration makes again once it knows the host keys
(engine/ssh_registration.py)."""

from __future__ import annotations

from backends.registry import GIVEN_HOSTS
from instances.models import Fleet, Instance, InstanceStatus
from muster.api_errors import InvalidInput
from projects.models import Project


def refuse_registered_elsewhere(project: Project, hosts: list[dict], facts: list | None = None,
                                fleet: Fleet | None = None, own_only: bool = False) -> None:
    """The apply's check: InvalidInput (a 400) naming each host `registered_elsewhere` finds."""
    errors = registered_elsewhere(project, hosts, facts, fleet, own_only)
    if errors:
        failure = InvalidInput(errors[0]["loc"], errors[0]["msg"])
        failure.errors = errors
        raise failure


def registered_elsewhere(project: Project, hosts: list[dict], facts: list | None = None,
                         fleet: Fleet | None = None, own_only: bool = False) -> list[dict]:
    """One machine sits in one live fleet: by address and port, and by host key once logged in; the
    errors ({loc, msg}) of the hosts that are in another. `own_only` (before any login): only this
    project's; another project's hosts are told only to whoever logs in with a key they accept, or
    registering would map other tenants' hosts."""
    live = Instance.objects.filter(backend=GIVEN_HOSTS).exclude(status=InstanceStatus.TERMINATED)
    if own_only:
        live = live.filter(project=project)
    if fleet is not None:
        live = live.exclude(fleet=fleet)
    errors = []
    for i, host in enumerate(hosts):
        where = f"host {host['hostname']}:{host['port']}"
        taken = live.filter(hostname__iexact=host["hostname"], port=host["port"]).select_related("fleet").first()
        how = "is already registered"
        if taken is None and facts is not None:
            taken = live.filter(host_key=facts[i].host_key).select_related("fleet").first()
            how = "presents the host key of a machine already registered"
        if taken is None:
            continue
        if taken.project_id == project.id:
            msg = (f"{where} {how} as instance {taken.name} (fleet {taken.fleet.name if taken.fleet else '-'}): "
                   "delete that fleet first or remove the host from this one")
        else:
            # Another project's fleet and instance names are none of this project's business.
            msg = (f"{where} {how} in another project: it can be in one fleet at a time, so it must be "
                   "removed there first")
        errors.append({"loc": ["ssh_config", "hosts", i], "msg": msg})
    if facts is not None:
        first: dict[str, int] = {}
        for i, found in enumerate(facts):
            if found.host_key in first:
                errors.append({"loc": ["ssh_config", "hosts", i], "msg": (
                    f"host {hosts[i]['hostname']}:{hosts[i]['port']} is the same machine as hosts[{first[found.host_key]}] "
                    "(it presents the same host key): list each machine once")})
            first.setdefault(found.host_key, i)
    return errors
