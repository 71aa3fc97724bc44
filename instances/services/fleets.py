"""Applying and deleting fleets: validate, write, send a message. No host is contacted here: an SSH
fleet is written `pending` and registered by a claimed step (engine/registration.py), and a fleet
to delete is written `terminating` and removed by one (engine/fleet_deletion.py)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from backends import registry
from engine import messages
from events.services import record
from instances.lookup import fleet_in_use
from instances.models import Fleet, FleetStatus, GroupKind, Instance, InstanceStatus, Placement
from instances.services import fleet_shares, ssh_fleets
from instances.transitions import move_fleet, move_instances
from muster.api_errors import InvalidInput
from projects.models import Project
from projects.services.access import check_local_fleet
from runs.choices import JOB_ACTIVE, JobReason
from runs.configuration import ConfigurationError, load_document, parse_fleet_configuration
from runs.models import Job
from runs.transitions import terminate_job


def _configuration(payload: Any) -> tuple[dict, list[dict]]:
    """The validated configuration, and its warnings (keys accepted that take no effect here)."""
    data = payload.get("configuration", payload) if isinstance(payload, dict) else payload
    if data in (None, ""):
        raise ConfigurationError([{"loc": ["configuration"], "msg": "required: the fleet configuration"}])
    doc = load_document(data)
    if doc.get("type") != "fleet":
        raise ConfigurationError([{"loc": ["type"], "msg": "a fleet needs `type: fleet`"}])
    parsed = parse_fleet_configuration(doc)
    conf = parsed.model_dump(mode="json")
    if doc.get("nodes") is None:
        conf["nodes"] = None  # unset: each backend has its own default (local: MUSTER_LOCAL_FLEET_SIZE)
    return conf, parsed.warnings


def apply_fleet(project: Project, payload: Any, actor: str = "api", user=None) -> Fleet:
    """Create a fleet. An SSH fleet is returned `pending`; its registration (a claimed step) makes
    it `active` or `failed` (with `errors`). `fleet.warnings` lists the keys that take no effect on
    this fleet (not stored: they are said once, in the answer to the apply)."""
    conf, warnings = _configuration(payload)
    fleet = _apply(project, conf, actor, user)
    fleet.warnings = warnings
    return fleet


def _apply(project: Project, conf: dict, actor: str, user) -> Fleet:
    name = conf["name"]
    # A failed registration stays visible until it is applied again (or deleted).
    Fleet.objects.filter(project=project, name=name, status=FleetStatus.FAILED).delete()
    existing = Fleet.objects.filter(project=project, name=name).first()
    if existing is not None and existing.status == FleetStatus.ACTIVE and conf.get("ssh_config") and \
            fleet_shares.only_shares_differ(existing.configuration, ssh_fleets.stored_configuration(conf)):
        return fleet_shares.update_in_place(existing, conf, actor)  # its quotas or shares changed: nothing else
    if existing is not None:
        raise InvalidInput(["name"], f"fleet {name} already exists: delete it first or pick another name")
    if conf.get("ssh_config"):
        fleet = ssh_fleets.start_ssh_fleet(project, conf, actor=actor)
        messages.register_fleet(fleet.id, actor)
        return fleet
    backends = conf.get("backends") or [registry.DEFAULT_BACKEND]
    backend = registry.fleet_backend(backends)
    if len(backends) == 1 and backend == registry.LOCAL_HOSTS:
        count = _fixed_nodes(conf, default=settings.MUSTER["LOCAL_FLEET_SIZE"])
        check_local_fleet(user, count)
        policy = {"allow_privileged": conf.get("allow_privileged", False), "volumes": conf.get("volumes") or {}}
        return create_local_fleet(project, name, count, placement=conf.get("placement") or Placement.ANY, actor=actor,
                                  policy=policy)
    if len(backends) == 1 and registry.creates_groups(backend):
        return _create_cloud_fleet(project, conf, backend, actor)
    raise InvalidInput(["backends"], "use one backend per fleet: [local] or [gcp] (SSH hosts go in ssh_config)")


def _fixed_nodes(conf: dict, default: int) -> int:
    nodes = conf.get("nodes")
    if nodes is None:
        return default
    if isinstance(nodes, dict):
        return int(nodes.get("max") or nodes.get("min") or default)
    return int(nodes)


def create_local_fleet(project: Project, name: str, count: int, placement: str = "cluster", actor: str = "server",
                       policy: dict | None = None) -> Fleet:
    """`policy`: the fleet's container keys (allow_privileged, volumes), else the defaults (neither)."""
    compute = registry.get_compute(registry.LOCAL_HOSTS, {"first_index": _next_local_index()})
    offer = compute.get_offers({})[0]
    names = [f"{name}-{i}" for i in range(count)]
    records = compute.create_instances(offer, count, names)
    with transaction.atomic():
        fleet = Fleet.objects.create(
            project=project, name=name, backend=registry.LOCAL_HOSTS, placement=placement,
            configuration={"type": "fleet", "name": name, "backends": [registry.LOCAL_HOSTS], "nodes": count,
                           **(policy or {})},
            network="127.0.0.0/8",
        )
        for inst_name, rec in zip(names, records, strict=True):
            inst = Instance.objects.create(
                project=project, fleet=fleet, name=inst_name, status=InstanceStatus.IDLE,
                backend=registry.LOCAL_HOSTS, region=rec.region, hostname=rec.hostname, internal_ip=rec.internal_ip,
                resources=rec.resources or {}, backend_data=rec.backend_data, index=rec.worker_index,
                idle_since=timezone.now(),
            )
            record(project.id, f"instance {inst.name}", f"created at {inst.internal_ip}", status=inst.status,
                   actor=actor, instance_id=inst.id)
        record(project.id, f"fleet {name}", f"created with {count} local instances", actor=actor)
    return fleet


def _next_local_index() -> int:
    # Loopback addresses are machine-wide, so they stay unique across projects.
    used = Instance.objects.filter(backend=registry.LOCAL_HOSTS).exclude(status=InstanceStatus.TERMINATED).count()
    last = Instance.objects.filter(backend=registry.LOCAL_HOSTS).order_by("-id").first()
    return max(_index_of(settings.MUSTER["LOCAL_FIRST_ADDRESS"]), used, _index_of(last.internal_ip) + 1 if last else 0)


def _index_of(address: str) -> int:
    parts = [int(p) for p in address.split(".")]
    return ((parts[1] << 16) | (parts[2] << 8) | parts[3]) - 2


def _create_cloud_fleet(project: Project, conf: dict, backend: str, actor: str) -> Fleet:
    fleet = Fleet.objects.create(
        project=project, name=conf["name"], backend=backend, placement=conf.get("placement") or Placement.ANY,
        configuration=conf, idle_duration=conf.get("idle_duration"),
    )
    record(project.id, f"fleet {fleet.name}", f"created ({backend}); instances are created when runs need them",
           actor=actor)
    return fleet


def delete_fleet(fleet: Fleet, force: bool = False, actor: str = "api") -> Fleet:
    """Ask for the fleet's deletion; refused while a run uses it unless forced (its jobs are then
    ended). The claimed step delete_fleet stops its runners and removes it."""
    if fleet_in_use(fleet) and not force:
        raise InvalidInput(["name"], f"fleet {fleet.name} is used by a running job: stop the run or delete with force")
    with transaction.atomic():
        if force:
            for job in Job.objects.filter(instance__fleet=fleet, status__in=JOB_ACTIVE).select_related("run"):
                terminate_job(job, JobReason.TERMINATED_BY_SERVER, f"fleet {fleet.name} was deleted", actor=actor)
        if move_fleet(fleet, FleetStatus.TERMINATING, frm=[s for s in FleetStatus.values if s != FleetStatus.TERMINATING],
                      message="deletion requested", actor=actor):
            messages.delete_fleet(fleet.pk, actor)
    return fleet


def delete_instances(fleet: Fleet, indexes: list[int], actor: str = "api") -> list[Instance]:
    """Remove some hosts of a fleet (dstack's `fleet delete NAME -i N`); the fleet keeps the rest.

    All or nothing: refused when an index is not an instance of the fleet, when one runs a job or
    is not idle, while the fleet's hosts are being registered, and for a host of a TPU slice (a
    slice is deleted whole). The hosts leave the pool (idle -> terminated) in one transaction with
    the fleet's row locked, as placement locks it, so a run cannot take one meanwhile; their runner
    agents are then stopped by a worker (messages.stop_agents), best effort, as when the whole
    fleet is deleted: the request does no host I/O.
    """
    wanted = sorted(set(indexes))
    with transaction.atomic():
        Fleet.objects.select_for_update().filter(pk=fleet.pk).values_list("pk", flat=True).first()
        fleet.refresh_from_db(fields=["status"])
        if fleet.status == FleetStatus.PENDING:
            raise InvalidInput(["name"], f"fleet {fleet.name} is still registering its hosts: wait until it is "
                                         "active, then delete them")
        live = list(fleet.instances.exclude(status=InstanceStatus.TERMINATED).select_related("group")
                    .order_by("index", "name"))
        chosen = [inst for inst in live if inst.index in wanted]
        missing = sorted(set(wanted) - {inst.index for inst in chosen})
        if missing:
            raise InvalidInput(["instance_nums"], f"fleet {fleet.name} has no instances {missing}; its instances are "
                                                  f"{sorted({inst.index for inst in live})}")
        sliced = next((inst for inst in chosen if inst.group and inst.group.kind == GroupKind.TPU_POD), None)
        if sliced is not None:
            noun = registry.group_noun(sliced.group)
            raise InvalidInput(["instance_nums"], f"instance {sliced.name} is a host of {noun} {sliced.group.name}, "
                                                  "which is deleted whole: delete the fleet, or the slice "
                                                  f"(`DELETE instance-groups/{sliced.group.name}/`, docs/tpu.md)")
        in_use = "Failed to delete fleet {} instances {}. Fleet instances are in use: {}"  # dstack's words, then ours
        busy = [inst for inst in chosen if inst.status != InstanceStatus.IDLE]
        if busy:
            raise InvalidInput(["instance_nums"], in_use.format(fleet.name, wanted, ", ".join(
                f"{inst.name} is {inst.status}" for inst in busy)))
        moved = move_instances(chosen, InstanceStatus.TERMINATED, frm=[InstanceStatus.IDLE],
                               message="deleted from its fleet", actor=actor)
        if len(moved) != len(chosen):  # taken by a run between the read and the move: nothing is deleted
            raise InvalidInput(["instance_nums"], in_use.format(fleet.name, wanted, "a run just took one"))
        record(fleet.project_id, f"fleet {fleet.name}", f"instances {wanted} deleted", actor=actor)
        messages.stop_agents([inst.pk for inst in chosen])
    return chosen
