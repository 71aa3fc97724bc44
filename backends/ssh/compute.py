"""The ssh backend: hosts a user already has, registered into a fleet (engine/ssh_registration.py).

Nothing is ever created or deleted here. Capacity is exactly the registered hosts, so there are no
offers; the backend's whole job is handing out the channel to each host's runner agent.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

from backends.base import BackendError, Compute, InstanceOffer, ProvisioningData
from backends.ssh.runner_host import SSHRunnerHost


def ssh_timeout() -> float:
    return float(settings.MUSTER["SSH_TIMEOUT"])


class SSHCompute(Compute):
    name = "ssh"
    given_hosts = True
    user_keys_over_ssh = True

    def get_offers(self, requirements: dict[str, Any]) -> list[InstanceOffer]:
        return []  # an SSH fleet holds what was registered; placement looks at its idle instances

    def create_instances(self, offer: InstanceOffer, count: int, names: list[str]) -> list[ProvisioningData]:
        raise BackendError("the ssh backend cannot create machines: add hosts to an SSH fleet's ssh_config instead")

    def terminate(self, name: str, backend_data: dict[str, Any]) -> None:
        # The host is the user's: it stays. Its runner agent is stopped through runner_host().stop_agent()
        # by engine.groups, which has the instance (and so the address and key) at hand.
        return None

    def runner_host(self, instance: Any) -> SSHRunnerHost:
        return SSHRunnerHost(instance.ssh_target(), timeout=ssh_timeout())
