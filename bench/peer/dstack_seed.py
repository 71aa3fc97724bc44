"""Simulated idle SSH hosts in dstack's own SQLite database, so its scheduler places onto them
without connecting (the counterpart of Muster's hollow instances).

`seed_fleet()` runs this file with dstack's venv (it imports dstack's models, not Muster's), which
writes one `fleets` row (an SSH fleet, `placement: cluster`, as `dstack apply -f fleet.yml` would
store it) and H `instances` rows shaped as dstack's own `create_ssh_instance_model` makes them, but
already `idle` with one free block and the resources a shim would report (8 CPUs, 64 GB, 500 GB,
no GPU), as dstack leaves an SSH host after its shim answered. Their `last_processed_at` is a day
ahead, so the instance pipeline (which would SSH to them for health checks and mark them
unreachable) does not pick them up during the bench; the job pipeline's placement does not look at
that column. The jobs placed on them then fail to reach a runner, after the bench has read its figure.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def seed_fleet(db: Path, project: str, name: str, hosts: int) -> None:
    from bench.peer import dstack_api as dstack  # not at the top: this file also runs in dstack's venv

    subprocess.run([str(dstack.VENV / "bin" / "python"), __file__, str(db), project, name, str(hosts)],
                   check=True, timeout=300, env={"PATH": "/usr/bin:/bin"})


def _seed(db: str, project_name: str, name: str, hosts: int) -> None:  # runs in dstack's venv
    import datetime
    import uuid

    from dstack._internal.core.models.backends.base import BackendType
    from dstack._internal.core.models.fleets import (
        FleetConfiguration,
        FleetSpec,
        FleetStatus,
        InstanceGroupPlacement,
        SSHParams,
    )
    from dstack._internal.core.models.instances import (
        Disk,
        InstanceAvailability,
        InstanceOfferWithAvailability,
        InstanceStatus,
        InstanceType,
        RemoteConnectionInfo,
        Resources,
        SSHKey,
    )
    from dstack._internal.core.models.profiles import Profile, TerminationPolicy
    from dstack._internal.core.models.runs import JobProvisioningData
    from dstack._internal.server.models import FleetModel, InstanceModel, ProjectModel
    from sqlalchemy import create_engine, select
    from sqlalchemy.orm import Session

    addresses = [f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256 + 1}" for i in range(hosts)]
    key = SSHKey(public="ssh-ed25519 AAAA bench", private="bench-not-a-key")
    spec = FleetSpec(configuration=FleetConfiguration(
        name=name, placement=InstanceGroupPlacement.CLUSTER,
        ssh_config=SSHParams(user="root", ssh_key=key, hosts=addresses)), profile=Profile(name="default"))
    resources = Resources(cpus=8, memory_mib=64 * 1024, gpus=[], spot=False, disk=Disk(size_mib=500 * 1024))
    itype = InstanceType(name="ssh", resources=resources)
    now = datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
    later = now + datetime.timedelta(days=1)
    engine = create_engine(f"sqlite:///{db}", connect_args={"timeout": 60})
    with Session(engine) as session:
        project = session.execute(select(ProjectModel).where(ProjectModel.name == project_name)).scalar_one()
        fleet = FleetModel(id=uuid.uuid4(), name=name, project=project, status=FleetStatus.ACTIVE,
                           spec=spec.model_dump_json(), created_at=now, last_processed_at=later)
        session.add(fleet)
        for num, host in enumerate(addresses):
            jpd = JobProvisioningData(backend=BackendType.REMOTE, instance_type=itype, instance_id=f"{name}-{num}",
                                      hostname=host, region="remote", internal_ip=host, price=0, username="root",
                                      ssh_port=22, dockerized=True, backend_data="", ssh_proxy=None)
            offer = InstanceOfferWithAvailability(backend=BackendType.REMOTE, instance=itype, region="remote",
                                                  price=0.0, availability=InstanceAvailability.AVAILABLE)
            conn = RemoteConnectionInfo(host=host, port=22, ssh_user="root", ssh_keys=[key], env={})
            session.add(InstanceModel(
                id=uuid.uuid4(), name=f"{name}-{num}", instance_num=num, project=project, fleet=fleet,
                backend=BackendType.REMOTE, created_at=now, started_at=now, last_processed_at=later,
                status=InstanceStatus.IDLE, unreachable=False, job_provisioning_data=jpd.model_dump_json(),
                remote_connection_info=conn.model_dump_json(), offer=offer.model_dump_json(), region="remote",
                price=0.0, termination_policy=TerminationPolicy.DONT_DESTROY, termination_idle_time=0,
                total_blocks=1, busy_blocks=0))
        session.commit()


if __name__ == "__main__":
    _seed(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
