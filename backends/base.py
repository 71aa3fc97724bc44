"""The Compute interface every backend implements, and the records that cross it.

A backend knows how to find capacity (offers), create and delete machines, and reach the
runner agent on a machine (`runner_host`). It never touches the database: the instances app
calls it and records what it returns.
"""

from __future__ import annotations

import hashlib
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any


class BackendError(Exception):
    """A backend call failed; `reason` is a job termination reason when one fits. `transient`: the
    provider did not answer this time, which says nothing about the capacity (look again)."""

    reason = "executor_error"
    transient = False


@dataclass(frozen=True)
class GroupWatch:
    """One look at a live group at its provider: `lost` says why the capacity is gone ("" while
    it is there); `maintenance` is set while the provider says the group is under maintenance."""

    lost: str = ""
    maintenance: str = ""
    # A group made of parts (the slices of a multislice set): the parts lost, and why the first
    # was, so a group that replaces one part (on_slice_failure: replace-slice) can keep the others.
    lost_parts: tuple[int, ...] = ()
    part_lost: str = ""


class NoCapacityError(BackendError):
    reason = "failed_to_start_due_to_no_capacity"


class SliceInterruptedError(BackendError):
    """The provider took the capacity back (a spot slice preempted, a queued resource suspended):
    an interruption, which `retry: {on_events: [interruption]}` covers, not an executor error."""

    reason = "interrupted_by_no_capacity"


@dataclass(frozen=True)
class GroupPlan:
    """What one group of a run needs from a group-creating backend: `hosts` per group, and the
    `shape` the backend names the group by (kept on the group's row: reuse needs the same shape)."""

    hosts: int
    shape: str


@dataclass
class InstanceOffer:
    backend: str
    region: str
    instance_type: str
    resources: dict[str, Any]  # per host: cpus, memory_gb, disk_gb, cpu_arch, gpus[{name, memory_gb, vendor}], tpu
    price: float = 0.0
    hosts: int = 1  # > 1 for a multi-host TPU pod slice: one create call makes `hosts` instances
    zones: list[str] = field(default_factory=list)


@dataclass
class ProvisioningData:
    """One host that a create call produced (a pod slice produces one per host, in worker order)."""

    hostname: str  # the address Muster reaches the host on
    internal_ip: str  # the address peers use
    port: int = 22
    username: str = ""
    worker_index: int = 0
    region: str = ""
    resources: dict[str, Any] | None = None
    backend_data: dict[str, Any] = field(default_factory=dict)


@dataclass
class GroupProgress:
    """Where the creation of a group (a pod slice) stands after one call.

    `records`: one per host once the group is ready, else None (look again). `backend_data`: what
    the backend needs kept with the group for the next look (it may change on every look).
    """

    records: list[ProvisioningData] | None
    backend_data: dict[str, Any] = field(default_factory=dict)
    # Still queued at the provider (a queued resource not ACTIVE yet): the request's own
    # valid_until bounds the wait, not WAITING_INSTANCE_LIMIT.
    queued: bool = False
    # Epoch seconds the provider started making the group once it was no longer queued (None: it
    # was never queued); WAITING_INSTANCE_LIMIT counts from there instead of from the group's row.
    started_at: float | None = None


class RunnerHost(ABC):
    """How the server talks to the runner agent on one host (files on disk, or the same over SSH)."""

    @abstractmethod
    def ensure_agent(self, revive: bool = False) -> None:
        """Install the runner if needed and make sure its agent is running (idempotent).

        A home whose agent was stopped for good (`stop_agent`: its instance is being deleted) is
        refused with a BackendError unless `revive` (a registration) asks for it."""

    @abstractmethod
    def submit(self, job_id: str, spec: dict[str, Any]) -> None:
        """Hand a job spec to the agent; the agent starts it (idempotent by job_id)."""

    @abstractmethod
    def status(self) -> dict[str, Any]:
        """One round trip: {"agent": {...heartbeat...} | None, "jobs": {job_id: status}}."""

    @abstractmethod
    def stop(self, job_id: str) -> None:
        """Ask the agent to stop a job's process group."""

    @abstractmethod
    def read_log(self, job_id: str, offset: int = 0, limit: int = 1 << 20) -> bytes:
        """Bytes of the job's combined output from `offset`."""

    def read_log_timed(self, job_id: str, offset: int = 0, limit: int = 1 << 20) -> tuple[bytes, list[tuple[int, int]]]:
        """read_log's bytes and the runner's (offset, epoch ms) stamps of them (runner/log_times.py),
        as the host sent them: the caller checks them. No stamps: a runner from before them."""
        return self.read_log(job_id, offset, limit), []

    @abstractmethod
    def cleanup(self, job_id: str) -> None:
        """Forget a finished job's directory (logs are copied to the server first)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""

    def stop_agent(self) -> None:  # noqa: B027 - optional hook
        """Stop the agent for good (its instance is being deleted); a host without a lasting agent
        has nothing to stop."""


class Compute(ABC):
    """All a backend is. What the rest of Muster may ask without an instance is a class attribute
    or a classmethod; what needs the backend's settings is a method of an instance made with them
    (`backends.registry.get_compute(name, config)`)."""

    name: str = ""
    # The kind of fleet it makes: False, fixed hosts it is given or makes once at apply (a fleet
    # of rows); True, groups it creates when a run needs them (engine/pods.py), one create call
    # per group.
    creates_groups: bool = False
    # What a group of it is called in events and messages ("TPU slice").
    group_noun: str = "instance group"
    # Fleet keys only this backend accepts (beyond the cloud keys every group-creating one takes).
    own_fleet_keys: tuple[str, ...] = ()
    # Whether its fleets' containers run privileged unless the fleet says otherwise.
    privileged_by_default: bool = False
    # Why `spot_policy` means nothing on it ("" when it does): said as a warning at apply.
    spot_note: str = ""
    # Its fleets are the hosts written in `ssh_config`, never named in `backends`.
    given_hosts: bool = False
    # Its name in dstack's answers (dstack calls every fleet of hosts `remote`).
    dstack_name: str = "remote"
    # Its hosts are reached over SSH with a login whose authorized_keys Muster may add to, so a
    # user's attach or shell key can go there (runs/services/attach.py, engine/attach_installs.py).
    user_keys_over_ssh: bool = False

    @classmethod
    def fleet_config(cls, configuration: dict[str, Any]) -> dict[str, Any]:
        """Its settings for one fleet: the server's with what the fleet's configuration says. The
        result may carry `ssh_user` and `ssh_private_key`: how the server logs in to its hosts."""
        return {}

    @classmethod
    def kept_for_group(cls, configuration: dict[str, Any]) -> dict[str, Any]:
        """What a group keeps of its fleet's settings when it is made (`backend_data["fleet"]`), so
        it can still be deleted once the fleet's row is gone; never a secret."""
        return {}

    @classmethod
    def group_config(cls, kept: dict[str, Any]) -> dict[str, Any]:
        """A group's settings when its fleet is gone: the server's with what the group kept."""
        return {}

    @classmethod
    def plan_group(cls, requirements: dict[str, Any], hosts: int) -> GroupPlan | None:
        """The group one job's (normalized) resources ask for, for a run's group of `hosts` nodes
        (per slice); None when it asks for none this backend makes. The engine makes the group
        only when the plan's hosts are the run's."""
        return None

    @classmethod
    def group_name(cls, run_name: str, group_name: str, attempt: str = "") -> str:
        """The provider's id of a group: the same for the same `attempt` (run, group, submission),
        so a create tried again asks for what the first try may have made, never for a second."""
        base = re.sub(r"[^a-z0-9-]+", "-", f"{run_name}-{group_name}".lower()).strip("-") or "group"
        return f"{base}-{_digest(run_name, group_name, attempt)}"

    @classmethod
    def queued_view(cls, backend_data: dict[str, Any]) -> dict[str, Any] | None:
        """Where a group's request waits at its provider ({name, zone, state, since}) while it is
        queued there, from what the group keeps; None when it is not queued (a direct create). A
        queued group's own request bounds its wait, not WAITING_INSTANCE_LIMIT."""
        return None

    @classmethod
    def group_env(cls, hosts: list[str], index: int, backend_data: dict[str, Any]) -> dict[str, Any] | None:
        """What the job on host `index` of a group (all its hosts' internal addresses in worker
        order) is told about the group (the runner's spec "tpu" entry); None: nothing."""
        return None

    def __init__(self, config: dict[str, Any] | None = None):
        self.config = config or {}

    @abstractmethod
    def get_offers(self, requirements: dict[str, Any]) -> list[InstanceOffer]:
        """Offers able to hold one job with these (normalized) resource requirements."""

    @abstractmethod
    def create_instances(self, offer: InstanceOffer, count: int, names: list[str]) -> list[ProvisioningData]:
        """Create machines; a pod slice returns one record per host. Idempotent by name."""

    def update_provisioning_data(self, group_name: str, backend_data: dict[str, Any]) -> list[ProvisioningData] | None:
        """Poll a machine still being created; None while not ready."""
        return None

    @abstractmethod
    def terminate(self, name: str, backend_data: dict[str, Any]) -> None:
        """Delete one machine; a missing machine is success."""

    def create_group(self, offer: InstanceOffer, count: int, name: str) -> GroupProgress:
        """Start creating a whole group; raises only when it surely does not and will not exist."""
        raise NotImplementedError

    def poll_group(self, name: str, shape: str, backend_data: dict[str, Any]) -> GroupProgress:
        """One look at a group being created, carrying on from `backend_data`."""
        raise NotImplementedError

    def terminate_group(self, group_name: str, backend_data: dict[str, Any]) -> None:
        """Delete a whole group (a pod slice) with one call; a missing group is success."""
        raise NotImplementedError

    def watch_groups(self, groups: dict[str, dict[str, Any]]) -> dict[str, GroupWatch]:
        """How each of these live groups ({name: backend_data}) stands at the provider, in as few
        calls as it takes (one list per zone); groups it cannot tell about are left out."""
        return {}

    def replace_part(self, name: str, backend_data: dict[str, Any], index: int, until: float) -> dict[str, Any]:
        """Make part `index` of a live group again (one slice of a multislice set), keeping the
        others: the group's backend_data for the polls that do it (poll_group), asking for the part
        until `until` (epoch seconds) while there is no capacity. BackendError: not possible."""
        raise BackendError(f"{self.name} groups cannot replace one part")

    @abstractmethod
    def runner_host(self, instance: Any) -> RunnerHost:
        """The channel to the runner agent on `instance` (an instances.models.Instance)."""


def _digest(run_name: str, group_name: str, attempt: str) -> str:
    return hashlib.sha256(f"{run_name}\0{group_name}\0{attempt}".encode()).hexdigest()[:6]
