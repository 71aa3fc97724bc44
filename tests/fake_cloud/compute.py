"""A cloud backend that lives outside backends/: it creates groups of namespace-less local hosts.

Registered through MUSTER["EXTRA_BACKENDS"] as a deployment registers its own, it shows the engine
makes, polls, hands out and deletes groups of any backend through the contract alone
(backends/base.py): nothing here is TPU or Google. Each host is a local runner home on a loopback
address of its own (backends/local's machinery), past the addresses the tests' local fleets use.
A create answers "not yet" and the first poll finds the group ready, so both halves of the
engine's group path run.
"""

from __future__ import annotations

import itertools
import uuid
from pathlib import Path
from typing import Any

from django.conf import settings

from backends.base import Compute, GroupPlan, GroupProgress, InstanceOffer, ProvisioningData
from backends.local.compute import loopback_address
from backends.local.host import local_resources
from backends.local.runner_host import LocalRunnerHost

NAME = "fakecloud"
# loopback addresses past the tests' local fleets (tests/conftest.py gives each run a block)
_OFFSET = 200
_next = itertools.count()


class FakeCloudCompute(Compute):
    name = NAME
    creates_groups = True
    group_noun = "fake group"
    spot_note = "its hosts are this machine"

    @classmethod
    def plan_group(cls, requirements: dict[str, Any], hosts: int) -> GroupPlan | None:
        # any group the run asks for, of exactly its hosts: the shape just says how many
        return GroupPlan(hosts, f"{hosts}-hosts") if hosts > 0 else None

    def get_offers(self, requirements: dict[str, Any]) -> list[InstanceOffer]:
        return [InstanceOffer(backend=NAME, region="fake", instance_type="local-group", resources=local_resources())]

    def create_instances(self, offer: InstanceOffer, count: int, names: list[str]) -> list[ProvisioningData]:
        raise NotImplementedError("a group-creating backend is asked for groups")

    def create_group(self, offer: InstanceOffer, count: int, name: str) -> GroupProgress:
        first = _first_index() + next(_next) * 16
        homes = [str(Path(settings.MUSTER["LOCAL_DIR"]) / f"{name}-{k}-{uuid.uuid4().hex}" / "muster")
                 for k in range(count)]
        return GroupProgress(None, {"homes": homes, "first_index": first})

    def poll_group(self, name: str, shape: str, backend_data: dict[str, Any]) -> GroupProgress:
        homes, first = backend_data["homes"], int(backend_data["first_index"])
        records = [ProvisioningData(hostname=loopback_address(first + k), internal_ip=loopback_address(first + k),
                                    worker_index=k, region="fake", resources=local_resources(),
                                    backend_data={"home": home})
                   for k, home in enumerate(homes)]
        return GroupProgress(records, {"polled": True})

    def terminate(self, name: str, backend_data: dict[str, Any]) -> None:
        if backend_data.get("home"):
            LocalRunnerHost(backend_data["home"]).stop_agent()

    def terminate_group(self, group_name: str, backend_data: dict[str, Any]) -> None:
        for home in backend_data.get("homes") or []:
            LocalRunnerHost(home).stop_agent()

    def runner_host(self, instance: Any) -> LocalRunnerHost:
        return LocalRunnerHost(instance.backend_data["home"])


def _first_index() -> int:
    parts = [int(p) for p in settings.MUSTER["LOCAL_FIRST_ADDRESS"].split(".")]
    return ((parts[1] << 16) | (parts[2] << 8) | parts[3]) - 2 + _OFFSET
