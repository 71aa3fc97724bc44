"""The local backend: every instance is a directory and a loopback address of its own.

127.0.0.2, 127.0.0.3, ... all reach this machine, so two nodes of a run can both listen on
port 8000 (each binds its own DSTACK_NODE_IP). Jobs run through the same runner agent as on
remote hosts, started as a local process.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from django.conf import settings

from backends.base import Compute, InstanceOffer, ProvisioningData
from backends.local.host import local_resources
from backends.local.runner_host import LocalRunnerHost


def loopback_address(index: int) -> str:
    # 127.0.0.1 stays the server's; instances take 127.0.0.2 upwards (then 127.0.1.x, ...).
    n = index + 2
    return f"127.{(n >> 16) & 255}.{(n >> 8) & 255}.{n & 255}"


class LocalCompute(Compute):
    name = "local"
    spot_note = "its instances are this machine"

    def get_offers(self, requirements: dict[str, Any]) -> list[InstanceOffer]:
        return [InstanceOffer(backend="local", region="local", instance_type="process", resources=local_resources())]

    def create_instances(self, offer: InstanceOffer, count: int, names: list[str]) -> list[ProvisioningData]:
        start = int(self.config.get("first_index", 0))
        # Instance names are unique only within a project; a home shared by two projects' instances
        # would let one project read and stop the other's jobs. A fresh UUID per home never collides.
        return [
            ProvisioningData(
                hostname=loopback_address(start + i), internal_ip=loopback_address(start + i),
                worker_index=i, region="local", resources=offer.resources,
                backend_data={"home": str(Path(settings.MUSTER["LOCAL_DIR"]) / f"{name}-{uuid.uuid4().hex}" / "muster")},
            )
            for i, name in enumerate(names[:count])
        ]

    def terminate(self, name: str, backend_data: dict[str, Any]) -> None:
        home = backend_data.get("home")
        if home:
            LocalRunnerHost(home).stop_agent()

    def runner_host(self, instance: Any) -> LocalRunnerHost:
        return LocalRunnerHost(instance.backend_data["home"])
