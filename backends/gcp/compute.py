"""The gcp backend: Google Cloud TPU pod slices, one TPU node per instance group.

A slice of H hosts is created by one API call and becomes H instances (worker k -> instance k),
so this backend creates groups. The TPU node id is the group name; creating is idempotent by that
name, and nothing blocks on Google's long-running operation: `create_group` submits and returns
where the create stands (zone, operation, zones refused), and the provisioning sweep calls
`poll_group` with it until the node is READY, the operation fails over to the next zone, or the
create is refused for good.
"""

from __future__ import annotations

import hashlib
import re
import threading
from typing import Any

from django.conf import settings
from google.cloud import tpu_v2

from backends.base import (
    BackendError,
    Compute,
    GroupPlan,
    GroupProgress,
    GroupWatch,
    InstanceOffer,
    ProvisioningData,
    RunnerHost,
    SliceInterruptedError,
)
from backends.gcp import config, tpu_client, tpu_create, tpu_multislice, tpu_nodes, tpu_offers, tpu_queued
from backends.gcp.tpu_client import TpuConfig
from backends.gcp.tpu_nodes import SliceStatus
from backends.gcp.tpu_shapes import MEGASCALE_PORT, parse_slice

# States a slice passes through on its way to READY; anything else while provisioning is fatal.
_PENDING_STATES = tpu_nodes.PENDING_STATES


class GcpTpuCompute(Compute):
    name = "gcp"
    creates_groups = True
    group_noun = "TPU slice"
    dstack_name = "gcp"
    # a TPU VM is an SSH host (runner_host below): the fleet's SSH user takes attach and shell keys
    user_keys_over_ssh = True
    own_fleet_keys = ("queued_resource", "reservation")
    # the TPU runtime opens the chips' devices directly
    privileged_by_default = True

    @classmethod
    def fleet_config(cls, configuration: dict[str, Any]) -> dict[str, Any]:
        # the fleet's own zones/spot/runtime_version win over the server-wide GCP settings
        return config.merged(settings.MUSTER["GCP"], configuration)

    @classmethod
    def kept_for_group(cls, configuration: dict[str, Any]) -> dict[str, Any]:
        return config.kept_settings(configuration)

    @classmethod
    def group_config(cls, kept: dict[str, Any]) -> dict[str, Any]:
        return config.with_kept(settings.MUSTER["GCP"], kept)

    @classmethod
    def plan_group(cls, requirements: dict[str, Any], hosts: int) -> GroupPlan | None:
        # the slice decides the hosts, whatever the run counted
        shape = parse_slice(str(((requirements or {}).get("gpu") or {}).get("tpu") or ""))
        return GroupPlan(shape.hosts, shape.name) if shape is not None else None

    @classmethod
    def group_name(cls, run_name: str, group_name: str, attempt: str = "") -> str:
        """A TPU node id: lowercase letters, digits and '-', starting with a letter, at most 63 chars."""
        base = re.sub(r"[^a-z0-9-]+", "-", f"{run_name}-{group_name}".lower()).strip("-")
        if not base or not base[0].isalpha():
            base = f"pod-{base}".rstrip("-")
        digest = hashlib.sha256(f"{run_name}\0{group_name}\0{attempt}".encode()).hexdigest()[:6]
        # 63 minus "-" + 6 hex for the pod, minus "-NNNN" that instance names append.
        return f"{base[:50].rstrip('-')}-{digest}"

    @classmethod
    def queued_view(cls, backend_data: dict[str, Any]) -> dict[str, Any] | None:
        create = backend_data.get("create") or {}
        if not create.get("queued"):
            return None
        view = {"name": backend_data.get("queued_resource", ""), "zone": create.get("zone", ""),
                "state": create.get("qr_state", ""), "since": create.get("since")}
        if create.get("flex_deadline"):  # flex-start: when Google takes the slice back
            view.update(deadline=create["flex_deadline"], max_run_duration=create.get("max_run_duration"))
        return view

    @classmethod
    def group_env(cls, hosts: list[str], index: int, backend_data: dict[str, Any]) -> dict[str, Any] | None:
        """TPU_WORKER_ID and TPU_WORKER_HOSTNAMES within the host's slice; for a multislice set also
        the slice, the number of slices and the coordinator (slice 0 worker 0), the same on every host."""
        slices = int(backend_data.get("slices") or 1)
        per_slice = len(hosts) // slices
        mine = index // per_slice
        spec: dict[str, Any] = {"worker_id": index % per_slice,
                                "worker_hostnames": ",".join(hosts[mine * per_slice:(mine + 1) * per_slice])}
        if slices > 1:
            spec.update(num_slices=slices, slice_id=mine, coordinator_address=f"{hosts[0]}:{MEGASCALE_PORT}",
                        megascale_port=MEGASCALE_PORT)
        return spec

    def __init__(self, config: dict[str, Any] | None = None):
        super().__init__(config)
        self._tpu: TpuConfig | None = None
        self._client: tpu_v2.TpuClient | None = None
        self._client_lock = threading.Lock()

    @property
    def tpu(self) -> TpuConfig:
        # Checked on first use, not at construction: asking a backend what it is (creates_groups)
        # must not need a project and zones.
        if self._tpu is None:
            self._tpu = TpuConfig.from_dict(self.config)
        return self._tpu

    @property
    def client(self) -> tpu_v2.TpuClient:
        # Built on first use: constructing it resolves credentials, which offers do not need.
        with self._client_lock:
            if self._client is None:
                self._client = tpu_client.make_client(self.tpu)
            return self._client

    def get_offers(self, requirements: dict[str, Any]) -> list[InstanceOffer]:
        gpu = requirements.get("gpu")
        wanted = gpu.get("tpu") if isinstance(gpu, dict) else None
        shape = parse_slice(str(wanted)) if wanted else None
        if shape is None:
            return []
        return tpu_offers.slice_offers(self.tpu, [shape])

    def create_instances(self, offer: InstanceOffer, count: int, names: list[str]) -> list[ProvisioningData]:
        if not names:
            raise BackendError("gcp backend: no group name given")
        return self.create_group(offer, count, names[0]).records or []

    def create_group(self, offer: InstanceOffer, count: int, name: str) -> GroupProgress:
        shape = parse_slice(offer.instance_type)
        if shape is None:
            raise BackendError(f"gcp backend: {offer.instance_type!r} is not a TPU slice")
        slices = count // shape.hosts
        if count != shape.hosts * slices or slices < 1:
            raise BackendError(f"a {shape.name} slice has {shape.hosts} hosts; asked for {count} instances")
        if slices > 1 and (shape.hosts == 1 or shape.family.name in ("v2", "v3")):
            raise BackendError(f"{shape.name} slices cannot form a multislice set (v4 or newer, multi-host)")
        if not name:
            raise BackendError("gcp backend: no group name given")
        if self.tpu.queued:
            return self._progress(tpu_queued.create_queued(self.client, self.tpu, name, shape.name, _labels(name),
                                                           slices=slices), name, slices)
        if slices > 1:
            return self._progress(tpu_multislice.advance_set(self.client, self.tpu, name, shape.name, slices,
                                                             _labels(name)), name, slices)
        created = tpu_create.create_slice(self.client, self.tpu, name, shape.name, _labels(name))
        return self._progress(created, name)

    def poll_group(self, name: str, shape: str, backend_data: dict[str, Any]) -> GroupProgress:
        backend_data = backend_data or {}
        slices = int(backend_data.get("slices") or 1)
        state = backend_data.get("create")
        if state is None and not backend_data.get("node_name") and shape:
            # Rows planned but the create's outcome never recorded (the worker died in the call):
            # look the node up by its id, and create it if it is nowhere.
            state = {}
        if self.tpu.queued and not backend_data.get("node_name") and not state:
            state = {"queued": True}
        if state is not None and state.get("queued"):
            state = {**state, "slices": slices} if slices > 1 else state
            return self._progress(tpu_queued.advance_queued(self.client, self.tpu, name, shape, _labels(name), state),
                                  name, slices)
        if state is not None and slices > 1:
            return self._progress(tpu_multislice.advance_set(self.client, self.tpu, name, shape, slices,
                                                             _labels(name), state), name, slices)
        if state is not None:
            created = tpu_create.advance_slice(self.client, self.tpu, name, shape, _labels(name), state)
            return self._progress(created, name)
        return GroupProgress(self.update_provisioning_data(name, backend_data), backend_data)

    def update_provisioning_data(
        self, group_name: str, backend_data: dict[str, Any]
    ) -> list[ProvisioningData] | None:
        """None while the slice is on its way; one record per host, in worker order, once READY."""
        node_name = (backend_data or {}).get("node_name")
        if node_name:
            zone, status = tpu_client.zone_of(node_name), tpu_nodes.get_slice(self.client, self.tpu, node_name)
        else:
            # create_instances returned [] so the caller never learnt the zone: look in each one.
            found = tpu_nodes.find_slice(self.client, self.tpu, group_name)
            zone, status = found if found else ("", None)
            node_name = tpu_client.node_name(self.tpu, zone, group_name) if found else ""
        if status is None:
            raise BackendError(f"TPU slice {group_name} no longer exists")
        return self._records(zone, node_name, status)

    def _progress(self, created: tpu_create.CreatedSlice, name: str, slices: int = 1) -> GroupProgress:
        data: dict[str, Any] = {"create": created.state}
        if slices > 1:
            data["slices"] = slices
        if created.zone:
            data.update(zone=created.zone, node_name=created.node_name)
        queued = bool(created.state.get("queued"))
        if queued and created.zone:  # the request's id is the pod's name (slice 0's node is `<pod>-s-0`)
            data["queued_resource"] = tpu_client.queued_name(self.tpu, created.zone, name)
        if created.statuses is not None:
            records = self._set_records(created.statuses)
        else:
            records = self._records(created.zone, created.node_name, created.status) if created.status else None
        for rec in records or []:
            rec.backend_data.update({k: data[k] for k in ("queued_resource",) if k in data})
        active = queued and created.state.get("qr_state") == "ACTIVE"
        # a slice being replaced counts from its loss, and waits for capacity until replace_until
        replaced = created.state.get("replaced_at")
        return GroupProgress(records or None, data, queued=(queued and not active) or bool(created.state.get("waiting")),
                             started_at=created.state.get("since") if active else replaced)

    def replace_part(self, name: str, backend_data: dict[str, Any], index: int, until: float) -> dict[str, Any]:
        """Slice `index` of a separately created set is made again (on_slice_failure: replace-slice):
        the backend_data to keep, the next polls doing the work (tpu_multislice.replace_member)."""
        slices = int(backend_data.get("slices") or 1)
        if slices < 2 or not 0 <= index < slices:
            raise BackendError(f"{name} has no slice {index} to replace")
        if backend_data.get("queued_resource") or (backend_data.get("create") or {}).get("queued"):
            raise BackendError("a queued multislice request is filled and deleted whole by Google: its slices "
                               "cannot be replaced one by one")
        state = tpu_multislice.replace_member(name, slices, backend_data.get("create") or {}, index, until)
        return {**backend_data, "create": state}

    def _set_records(self, statuses: list[SliceStatus | None]) -> list[ProvisioningData] | None:
        """Every host of a multislice set once every slice is READY: slice i's worker k is host
        i x hosts + k, the rank JAX gives it."""
        out: list[ProvisioningData] = []
        for status in statuses:
            if status is None:
                return None
            records = self._records(tpu_client.zone_of(status.name), status.name, status)
            if records is None:
                return None
            for rec in records:
                rec.worker_index += len(out)
            out.extend(records)
        return out

    def _node_names(self, name: str, data: dict[str, Any]) -> list[str]:
        """The TPU nodes of a live pod: its one node, or every slice of a multislice set."""
        slices = int(data.get("slices") or 1)
        if slices == 1:
            return [data["node_name"]] if data.get("node_name") else []
        state = data.get("create") or {}
        if state.get("queued"):
            zone = data.get("zone") or state.get("zone")
            return [tpu_client.node_name(self.tpu, zone, tpu_client.slice_node_id(name, i))
                    for i in range(slices)] if zone else []
        return [tpu_client.node_name(self.tpu, m["zone"], tpu_client.member_node_id(name, i, m))
                for i, m in enumerate(state.get("members") or []) if m and m.get("zone")]

    def terminate_group(self, group_name: str, backend_data: dict[str, Any]) -> None:
        backend_data = backend_data or {}
        slices = int(backend_data.get("slices") or 1)
        if slices > 1 and not backend_data.get("queued_resource") and not self.tpu.queued:
            state = backend_data.get("create") or {}
            tpu_multislice.delete_set(self.client, self.tpu, group_name, slices, state.get("members"),
                                      state.get("retired"))
            return
        if backend_data.get("queued_resource"):
            tpu_queued.delete_queued(self.client, self.tpu, backend_data["queued_resource"])
            return
        node_name = backend_data.get("node_name")
        if not node_name and self.tpu.queued:
            # The request's zone was never recorded (the worker died in the create): look in each.
            found = tpu_queued.find_queued(self.client, self.tpu, group_name)
            if found is not None:
                tpu_queued.delete_queued(self.client, self.tpu, found[1].name)
                return
        if node_name and self.tpu.queued:
            owner = tpu_nodes.owning_request(self.client, self.tpu, node_name)
            if owner:  # a node made by a queued resource goes with its request
                tpu_queued.delete_queued(self.client, self.tpu, owner)
                return
        if not node_name:
            found = tpu_nodes.find_slice(self.client, self.tpu, group_name)
            if found is None:
                return
            node_name = tpu_client.node_name(self.tpu, found[0], group_name)
        tpu_nodes.delete_slice(self.client, self.tpu, node_name)

    def watch_groups(self, groups: dict[str, dict[str, Any]]) -> dict[str, GroupWatch]:
        wanted = {name: self._node_names(name, data) for name, data in groups.items()}
        zones = sorted({tpu_client.zone_of(n) for names in wanted.values() for n in names})
        nodes: dict[str, SliceStatus] = {}
        requests: dict[str, str] = {}
        for zone in zones:  # one list per zone (and one of the requests where some pod has one)
            nodes.update({s.name: s for s in tpu_nodes.list_slices(self.client, self.tpu, zone)})
            if any(d.get("queued_resource") and tpu_client.zone_of(d["queued_resource"]) == zone
                   for d in groups.values()):
                requests.update(tpu_queued.list_queued(self.client, self.tpu, zone))
        out = {}
        for name, data in groups.items():
            if not wanted[name]:
                continue
            looks = [_watch(nodes.get(n), n, data, requests) for n in wanted[name]]
            lost = next((w for w in looks if w.lost), None)
            if lost and len(looks) > 1:
                # One slice of a multislice set lost: the set cannot run without it (xpk, JobSet),
                # unless its run replaces that slice alone (engine/slice_replace.py).
                parts = tuple(i for i, w in enumerate(looks) if w.lost)
                lost = GroupWatch(lost=f"{lost.lost} (a slice of a {len(looks)}-slice set: the whole set goes)",
                                  lost_parts=parts, part_lost=lost.lost)
            out[name] = lost or next((w for w in looks if w.maintenance), GroupWatch())
        return out

    def terminate(self, name: str, backend_data: dict[str, Any]) -> None:
        """Deletes the whole slice the host belongs to.

        The TPU API has no per-host delete: a slice lives and dies as one node. Terminating any of
        its instances therefore ends all of them, which is what a pod-slice group expects anyway.
        Without backend_data, `name` is taken to be the group (node id).
        """
        self.terminate_group(name, backend_data)

    def runner_host(self, instance: Any) -> RunnerHost:
        from backends.ssh.runner_host import SSHRunnerHost  # TPU hosts are plain SSH hosts

        return SSHRunnerHost(instance.ssh_target())

    def _records(self, zone: str, node_name: str, status: SliceStatus) -> list[ProvisioningData] | None:
        if status.state in _PENDING_STATES:
            return None
        if status.state in tpu_nodes.LOST_STATES:
            raise SliceInterruptedError(f"TPU slice {node_name} is {status.state} (taken back by Google)")
        if status.state != "READY":
            raise BackendError(f"TPU slice {node_name} is {status.state}")
        shape = parse_slice(status.accelerator_type)
        if shape is None:
            raise BackendError(f"TPU slice {node_name} has unknown type {status.accelerator_type!r}")
        if len(status.hosts) < shape.hosts:
            return None  # READY but endpoints not all published yet: poll again
        resources = tpu_offers.host_resources(shape)
        return [
            ProvisioningData(
                hostname=h.external_ip or h.internal_ip,
                internal_ip=h.internal_ip,
                worker_index=h.worker_index,
                region=zone,
                resources=dict(resources),
                backend_data={"zone": zone, "node_name": node_name},
            )
            for h in status.hosts[: shape.hosts]
        ]


def _watch(node: SliceStatus | None, name: str, data: dict[str, Any], requests: dict[str, str]) -> GroupWatch:
    request = data.get("queued_resource")
    if request and requests.get(request) in tpu_queued.LOST_STATES:
        why = tpu_queued.flex_end(data.get("create") or {})
        return GroupWatch(lost=f"queued resource {request} is {requests[request]}" + (f" ({why})" if why else ""))
    if request and request not in requests:
        return GroupWatch(lost=f"queued resource {request} is gone")
    if node is None:
        return GroupWatch(lost=f"TPU node {name} is gone")
    if node.state in tpu_nodes.LOST_STATES:
        return GroupWatch(lost=f"TPU node {name} is {node.state}")
    if node.health == "UNHEALTHY_MAINTENANCE":
        return GroupWatch(maintenance=f"TPU node {name} is {node.health}")
    return GroupWatch()


def _labels(group: str) -> dict[str, str]:
    return {"managed-by": "muster", "muster-group": _label_value(group)}


def _label_value(text: str) -> str:
    # GCP label values: at most 63 of lowercase letters, digits, '-' and '_'.
    return re.sub(r"[^a-z0-9_-]", "-", text.lower())[:63]
