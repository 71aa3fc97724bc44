"""Applying an SSH fleet: the checks that need no network, then the fleet and its hosts written
`pending`. Nothing is contacted here: the claimed step `register_fleet` (engine/registration.py,
engine/ssh_registration.py) does that, so a slow or hostile host never holds the web request.
"""

from __future__ import annotations

import uuid
from collections import Counter

from django.db import IntegrityError, transaction

from backends.registry import GIVEN_HOSTS
from events.services import record
from instances.models import Fleet, FleetStatus, Instance, InstanceStatus, Placement
from instances.services import fleet_shares
from instances.ssh_hosts import refuse_registered_elsewhere
from muster import crypto
from muster.api_errors import InvalidInput
from projects.models import Project


def start_ssh_fleet(project: Project, conf: dict, actor: str = "api") -> Fleet:
    """Write the fleet and one pending instance per host after the checks that need no network.

    Nothing is contacted here: `complete_registration` (in the claimed step `register_fleet`,
    engine/registration.py) does that, so a slow or hostile host never holds the web request.
    """
    hosts: list[dict] = conf["ssh_config"]["hosts"]
    _refuse_server_paths(hosts)
    refuse_registered_elsewhere(project, hosts, own_only=True)
    shares = fleet_shares.rows_for(project, conf)  # its 400s before anything is written
    name = conf["name"]
    fleet_key = Counter(h["private_key"] for h in hosts).most_common(1)[0][0]
    try:
        with transaction.atomic():
            refuse_registered_elsewhere(project, hosts, own_only=True)  # again: a concurrent apply may have won
            fleet = Fleet(project=project, name=name, backend=GIVEN_HOSTS, status=FleetStatus.PENDING,
                          placement=conf.get("placement") or Placement.ANY, configuration=stored_configuration(conf))
            fleet.private_key = fleet_key
            fleet.save()
            fleet_shares.write(fleet, shares)
            for i, host in enumerate(hosts):
                Instance.objects.create(
                    project=project, fleet=fleet, index=i, name=f"{name}-{i}", status=InstanceStatus.PENDING,
                    backend=GIVEN_HOSTS, hostname=host["hostname"], port=host["port"], username=host["user"],
                    host_key=host.get("host_key") or "",  # given: the host must present exactly this key
                    private_key_encrypted=crypto.encrypt(host["private_key"]) if host["private_key"] != fleet_key else "",
                    # A runner home of its own per instance, named by nothing another fleet or project can
                    # reuse: two fleets on one login never share (or stop) each other's runner files and jobs.
                    backend_data={"runner_home": f"instances/{uuid.uuid4().hex}", "registration": "waiting"},
                )
            record(project.id, f"fleet {name}", f"registering {len(hosts)} ssh hosts", actor=actor)
    except IntegrityError as exc:
        # A concurrent request took the fleet name (or an instance name) between the checks and the insert.
        raise InvalidInput(["name"], f"fleet {name} (or an instance named {name}-N) already "
                                     "exists: delete it first or pick another name") from exc
    return fleet


def _refuse_server_paths(hosts: list[dict]) -> None:
    # The server never opens a path it is sent: it would log in with the server's own keys, and
    # "cannot read" vs "not a key" would tell which server files exist. The message is the same
    # whatever the path is.
    for i, host in enumerate(hosts):
        if host.get("identity_file"):
            raise InvalidInput(
                ["ssh_config", "hosts", i, "identity_file"],
                f"host {host['hostname']}:{host['port']}: identity_file names a file on your machine, which "
                "the server does not read: send the key's content as `private_key` instead (the muster "
                "CLI reads identity_file and sends its content)",
            )


def stored_configuration(conf: dict) -> dict:
    ssh = conf["ssh_config"]
    hosts = [{k: v for k, v in h.items() if k != "private_key"} for h in ssh["hosts"]]
    return {**conf, "ssh_config": {**{k: v for k, v in ssh.items() if k != "private_key"}, "hosts": hosts}}
