"""Hollow TPU fleets for the chaos bench: the real gcp backend against the fake TPU API, on hosts
whose runner starts no process (bench.hollow's; a job runs MUSTER["HOLLOW_TPU_RUN_SECONDS"]).

Everything about slices is the product's: creating (directly or as queued resources), polling,
watching live pods, deleting. Only reaching a host is hollow, so a run needs no sshd
per TPU host. The fleet's settings are the ones a gcp
fleet would merge from its configuration (the registry merges MUSTER["GCP"] for `gcp` fleets
only), fixed per backend name: `hollow_tpu` creates spot slices, `hollow_tpu_q` asks for
them as queued spot resources. The fake's address and the zones come from MUSTER["GCP"] (the
MUSTER_GCP_* variables the bench gives its workers).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

from backends.gcp.compute import GcpTpuCompute
from backends.gcp.config import merged
from bench.hollow import HollowRunnerHost

DIRECT, QUEUED = "hollow_tpu", "hollow_tpu_q"  # (Fleet.backend holds 16 characters)


class HollowTpuCompute(GcpTpuCompute):
    name = DIRECT
    extra: dict[str, Any] = {"spot": True}
    # As any extra backend before the contract: its settings are the fixed ones below (not a
    # fleet's), its containers are not privileged by default, and dstack calls its hosts `remote`.
    privileged_by_default = False
    dstack_name = "remote"

    @classmethod
    def fleet_config(cls, configuration: dict[str, Any]) -> dict[str, Any]:
        return {}

    @classmethod
    def kept_for_group(cls, configuration: dict[str, Any]) -> dict[str, Any]:
        return {}

    @classmethod
    def group_config(cls, kept: dict[str, Any]) -> dict[str, Any]:
        return {}

    def __init__(self, config: dict[str, Any] | None = None):
        super().__init__({**merged(settings.MUSTER["GCP"], {}), **self.extra, **(config or {})})

    def runner_host(self, instance: Any) -> HollowRunnerHost:
        # Long enough for a preemption to find the slice in use, however loaded the machine.
        return HollowRunnerHost(instance.pk, float(settings.MUSTER["HOLLOW_TPU_RUN_SECONDS"]))


class HollowQueuedTpuCompute(HollowTpuCompute):
    name = QUEUED
    extra = {"spot": True, "queued_resource": {}}


def make_hollow_tpu_fleet(project, name: str, backend: str):
    """A fleet row that creates slices on demand and deletes each one as soon as its run is over."""
    from instances.models import Fleet

    return Fleet.objects.create(project=project, name=name, backend=backend, idle_duration=0,
                                configuration={"type": "fleet", "name": name, "backends": ["gcp"],
                                               "idle_duration": 0})
