"""Applying and deleting fleets. SSH hosts are contacted by a claimed step (engine/registration.py) after the fleet is written as pending."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from backends.registry import get_compute
from events.services import record
from instances.models import Fleet, FleetBackend, FleetStatus, GroupKind, Instance, InstanceStatus, Placement
from instances.transitions import move_instances
from muster.api_errors import InvalidInput
from projects.models import Project
from projects.services.access import check_local_fleet
from runs.configuration import ConfigurationError, load_document, parse_fleet_configuration


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


def apply_fleet(project: Project, payload: Any, actor: str = "api", user=None, wait: bool = True) -> Fleet:
    """Create a fleet. An SSH fleet's hosts are registered in this call when `wait` (then a failure
    is an InvalidInput and nothing is kept), else by a Celery task: the fleet is returned `pending`
    and ends `active` or `failed` (with `errors`). `fleet.warnings` lists the keys that take no
    effect on this fleet (not stored: they are said once, in the answer to the apply)."""
    conf, warnings = _configuration(payload)
    fleet = _apply(project, conf, actor, user, wait)
    fleet.warnings = warnings
    return fleet


def _apply(project: Project, conf: dict, actor: str, user, wait: bool) -> Fleet:
    name = conf["name"]
    # A failed registration stays visible until it is applied again (or deleted).
    Fleet.objects.filter(project=project, name=name, status=FleetStatus.FAILED).delete()
    if Fleet.objects.filter(project=project, name=name).exists():
        raise InvalidInput(["name"], f"fleet {name} already exists: delete it first or pick another name")
    if conf.get("ssh_config"):
        return _apply_ssh_fleet(project, conf, actor, wait)
    backends = conf.get("backends") or ["local"]
    if backends == ["local"]:
        count = _fixed_nodes(conf, default=settings.MUSTER["LOCAL_FLEET_SIZE"])
        check_local_fleet(user, count)
        policy = {"allow_privileged": conf.get("allow_privileged", False), "volumes": conf.get("volumes") or {}}
        return create_local_fleet(project, name, count, placement=conf.get("placement") or Placement.ANY, actor=actor,
                                  policy=policy)
    if backends == ["gcp"]:
        return _create_cloud_fleet(project, conf, FleetBackend.GCP, actor)
    raise InvalidInput(["backends"], "use one backend per fleet: [local] or [gcp] (SSH hosts go in ssh_config)")


def _apply_ssh_fleet(project: Project, conf: dict, actor: str, wait: bool) -> Fleet:
    from engine import messages, registration
    from instances.services import ssh_fleets

    fleet = ssh_fleets.start_ssh_fleet(project, conf, actor=actor)
    if not wait:
        messages.register_fleet(fleet.id, actor)
        return fleet
    registration.register_fleet(fleet.id, actor=actor)
    fleet.refresh_from_db()
    if fleet.status == FleetStatus.FAILED:
        failure = InvalidInput(fleet.errors[0]["loc"], fleet.errors[0]["msg"])
        failure.errors = fleet.errors
        fleet.instances.all().delete()  # never used: nothing of a refused registration is kept
        fleet.delete()
        raise failure
    return fleet


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
    compute = get_compute("local", {"first_index": _next_local_index()})
    offer = compute.get_offers({})[0]
    names = [f"{name}-{i}" for i in range(count)]
    records = compute.create_instances(offer, count, names)
    with transaction.atomic():
        fleet = Fleet.objects.create(
            project=project, name=name, backend=FleetBackend.LOCAL, placement=placement,
            configuration={"type": "fleet", "name": name, "backends": ["local"], "nodes": count, **(policy or {})},
            network="127.0.0.0/8",
        )
        for inst_name, rec in zip(names, records, strict=True):
            inst = Instance.objects.create(
                project=project, fleet=fleet, name=inst_name, status=InstanceStatus.IDLE,
                backend=FleetBackend.LOCAL, region="local", hostname=rec.hostname, internal_ip=rec.internal_ip,
                resources=rec.resources or {}, backend_data=rec.backend_data, index=rec.worker_index,
                idle_since=timezone.now(),
            )
            record(project.id, f"instance {inst.name}", f"created at {inst.internal_ip}", status=inst.status,
                   actor=actor, instance_id=inst.id)
        record(project.id, f"fleet {name}", f"created with {count} local instances", actor=actor)
    return fleet


def _next_local_index() -> int:
    # Loopback addresses are machine-wide, so they stay unique across projects.
    used = Instance.objects.filter(backend=FleetBackend.LOCAL).exclude(status=InstanceStatus.TERMINATED).count()
    last = Instance.objects.filter(backend=FleetBackend.LOCAL).order_by("-id").first()
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


def fleet_in_use(fleet: Fleet) -> bool:
    from runs.choices import JOB_UNFINISHED
    from runs.models import Job

    return Job.objects.filter(instance__fleet=fleet, status__in=JOB_UNFINISHED).exists()


def delete_fleet(fleet: Fleet, force: bool = False, actor: str = "api") -> None:
    """Stop runners and remove instances; refused while a run uses the fleet unless forced."""
    from engine import groups

    if fleet_in_use(fleet) and not force:
        raise InvalidInput(["name"], f"fleet {fleet.name} is used by a running job: stop the run or delete with force")
    if force:
        from engine.stopping import stop_jobs_on_fleet

        stop_jobs_on_fleet(fleet, actor=actor)
    groups.terminate_fleet_instances(fleet, actor=actor)
    record(fleet.project_id, f"fleet {fleet.name}", "deleted", actor=actor)
    fleet.delete()


def delete_instances(fleet: Fleet, indexes: list[int], actor: str = "api") -> list[Instance]:
    """Remove some hosts of a fleet (dstack's `fleet delete NAME -i N`); the fleet keeps the rest.

    All or nothing: refused when an index is not an instance of the fleet, when one runs a job or
    is not idle, while the fleet's hosts are being registered, and for a host of a TPU slice (a
    slice is deleted whole). The hosts leave the pool (idle -> terminated) in one transaction with
    the fleet's row locked, as placement locks it, so a run cannot take one meanwhile; their runner
    agents are then stopped, best effort, as when the whole fleet is deleted.
    """
    from engine import groups

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
            raise InvalidInput(["instance_nums"], f"instance {sliced.name} is a host of TPU slice {sliced.group.name}, "
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
    groups.stop_agents(chosen)
    return chosen
