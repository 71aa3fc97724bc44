"""Muster's rows in dstack 0.22.5's shapes (JSON only: dstack is never imported at run time).

The client validates answers with its pydantic models and closed enums: run and job statuses are
the same value sets as Muster's, instance statuses too, a fleet's `pending` is dstack's
`submitted`, and `ssh`/`local` backends are dstack's `remote` (it has neither).
"""

from __future__ import annotations

from datetime import UTC, datetime

from django.utils import timezone

from backends.registry import dstack_name
from dstack_api.services import gateway
from dstack_api.services.access import WRITE_ROLES, dstack_role
from dstack_api.services.ids import uuid_of
from instances.models import Fleet, FleetStatus, Instance, InstanceStatus
from projects.models import Role
from runs.choices import JobStatus, RunStatus
from runs.models import Job, Run
from runs.services.attach import job_ports
from serving.urls_for import service_url

FLEET_STATUS = {FleetStatus.PENDING: "submitted", FleetStatus.ACTIVE: "active", FleetStatus.FAILED: "failed",
                FleetStatus.TERMINATING: "terminating"}
# the words the CLI shows (and colours) in its STATUS column
JOB_STATUS_MESSAGE = {JobStatus.SUBMITTED: "pending", JobStatus.TERMINATED: "stopped", JobStatus.ABORTED: "aborted"}


def _iso(value) -> str:
    return (value or timezone.now()).isoformat()


def user_name(user) -> str:
    return user.username if user is not None else "api"


def user_object(user, ssh_public_key: str | None = None) -> dict:
    return {"id": uuid_of("user", user.pk), "username": user.username,
            "global_role": "admin" if user.is_superuser else "user", "active": user.is_active,
            "permissions": {"can_create_projects": user.is_superuser}, "ssh_public_key": ssh_public_key}


def project_object(project, memberships, caller) -> dict:
    """dstack's Project: its members with dstack's roles (admin, or user for user and read-only) and
    whether they may manage SSH fleets (Muster's writers may)."""
    members = list(memberships)
    owner = next((m.user for m in members if m.role == Role.ADMIN), caller)
    return {"project_id": uuid_of("project", project.pk), "project_name": project.name,
            "owner": user_object(owner), "backends": [], "is_public": False,
            "members": [{"user": user_object(m.user), "project_role": dstack_role(m.role, m.user.is_superuser),
                         "permissions": {"can_manage_ssh_fleets": m.role in WRITE_ROLES, "can_manage_secrets": False}}
                        for m in members]}


def _range(low, high) -> dict:
    return {"min": low, "max": high}


def requirements(resources: dict | None) -> dict:
    """Muster's normalized resources as dstack's ResourcesSpec."""
    res = resources or {}
    cpu, memory, disk, gpu = (res.get(k) or {} for k in ("cpu", "memory", "disk", "gpu"))
    out = {"cpu": {"arch": cpu.get("arch"), "count": _range(cpu.get("min"), cpu.get("max"))},
           "memory": _range(memory.get("min"), memory.get("max")),
           "disk": {"size": _range(disk.get("min"), disk.get("max"))},
           "gpu": {"count": {"min": 0, "max": 0}}}
    if res.get("gpu"):
        count = gpu.get("count") or {}
        names = [gpu["tpu"]] if gpu.get("tpu") else (gpu.get("names") or None)
        out["gpu"] = {"vendor": gpu.get("vendor"), "name": names,
                      "count": _range(count.get("min"), count.get("max")),
                      "memory": _range(gpu["memory"].get("min"), gpu["memory"].get("max")) if gpu.get("memory") else None}
    return {"resources": out, "spot": False, "max_price": None}


def job_spec(run_name: str, configuration: dict, spec: dict, jobs_per_replica: int,
             ports: list[int] | None = None) -> dict:
    groups = configuration.get("groups") or [{}]
    index = spec.get("node_group_index", 0)
    group = groups[index] if 0 <= index < len(groups) else {}
    return {
        "replica_num": spec.get("replica_num", 0), "job_num": spec["job_num"],
        "job_name": f"{run_name}-{spec['job_num']}-{spec.get('replica_num', 0)}",
        "jobs_per_replica": jobs_per_replica,
        # the CLI forwards each app's port through the gateway (`dstack attach`)
        "app_specs": [{"port": p, "app_name": f"port-{p}"} for p in ports or []],
        "commands": list(group.get("commands") or []), "env": {},  # env values stay out of answers
        "image_name": group.get("image") or "", "requirements": requirements(spec.get("resources")),
        "node_group_index": index, "node_group_name": spec.get("node_group_name", ""),
        "node_group_job_index": spec.get("node_group_rank", 0),
    }


def _instance_type(instance: Instance) -> dict:
    res = instance.resources or {}
    gpus = [{"name": (f"tpu-{res['tpu']}" if res.get("tpu") else (g.get("name") or "gpu")),
             "memory_mib": int(float(g.get("memory_gb") or 0) * 1024)}
            for g in (res.get("gpus") or []) if isinstance(g, dict)]
    return {"name": instance.backend, "resources": {
        "cpus": int(res.get("cpus") or 0), "memory_mib": int(float(res.get("memory_gb") or 0) * 1024),
        "gpus": gpus, "spot": False, "disk": {"size_mib": int(float(res.get("disk_gb") or 0) * 1024)}}}


def _provisioning(job: Job) -> dict | None:
    instance = job.instance
    if instance is None:
        return None
    return {"backend": dstack_name(instance.backend), "instance_type": _instance_type(instance),
            "instance_id": instance.name, "hostname": instance.hostname or instance.internal_ip or instance.name,
            "internal_ip": instance.internal_ip or None, "region": instance.region or instance.backend,
            "price": instance.price, "username": instance.username or "root", "ssh_port": instance.port,
            # the CLI reaches the job through Muster's gateway as its jump host (dstack_api/gateway/),
            # which serves the stream to hostname:ssh_port itself: they need only be there (the CLI asserts them)
            "dockerized": False, "ssh_proxy": gateway.jump_host(job), "backend_data": None}


def job_submission(job: Job) -> dict:
    finished = datetime.fromtimestamp(job.end_time, tz=UTC) if job.end_time else None
    return {
        "id": str(job.uuid), "submission_num": job.submission_num, "deployment_num": job.deployment_num,
        "submitted_at": _iso(job.created), "last_processed_at": _iso(job.status_changed_at),
        "finished_at": finished.isoformat() if finished and job.finished else None,
        "status": job.status, "status_message": JOB_STATUS_MESSAGE.get(job.status, job.status),
        "termination_reason": job.termination_reason or None,
        "termination_reason_message": job.termination_message or None, "exit_status": job.exit_status,
        "job_provisioning_data": _provisioning(job), "error": None,
        # dstack's shape for a service replica's probes: the streak of each, as the runner counted it
        "probes": [{"success_streak": p.get("success_streak", 0)} for p in job.probes or [] if isinstance(p, dict)],
    }


def run_spec_of(run: Run, ssh_key_pub: str) -> dict:
    """The run's configuration as dstack's client reads it back (it validates it with dstack's rules:
    commands or an image, and `groups` without top-level commands)."""
    groups = [g for g in run.configuration.get("groups") or [] if isinstance(g, dict)] or [{}]
    if run.configuration.get("type") == "service":
        shown = service_shown(run.name, run.configuration, groups)
        return {"run_name": run.name, "repo_id": "none", "repo_data": {"repo_type": "virtual"},
                "configuration_path": None, "configuration": shown, "profile": None, "ssh_key_pub": ssh_key_pub}
    shown: dict = {"type": "task", "name": run.name}
    if len(groups) == 1:
        shown.update(nodes=int(groups[0].get("nodes") or 1), commands=list(groups[0].get("commands") or []))
        if groups[0].get("image"):
            shown["image"] = groups[0]["image"]
        if not shown["commands"] and "image" not in shown:
            shown["commands"] = [":"]
    else:
        shown["groups"] = [{"name": g.get("name"), "nodes": int(g.get("nodes") or 1),
                            "commands": list(g.get("commands") or [])} for g in groups]
    return {"run_name": run.name, "repo_id": "none", "repo_data": {"repo_type": "virtual"},
            "configuration_path": None, "configuration": shown, "profile": None, "ssh_key_pub": ssh_key_pub}


def _replicas_shown(group: dict) -> int | str:
    replicas = group.get("replicas") or {}
    low, high = replicas.get("min", 1), replicas.get("max", 1)
    return low if low == high else f"{low}..{high}"


def _group_shown(group: dict) -> dict:
    """A replica group as dstack's client validates it: replicas, a range with its scaling, and
    something to run."""
    shown = {"replicas": _replicas_shown(group), "commands": list(group.get("commands") or [])}
    if group.get("scaling"):
        shown["scaling"] = {k: group["scaling"][k] for k in ("metric", "target", "scale_up_delay", "scale_down_delay")
                            if k in group["scaling"]}
    if group.get("image"):
        shown["image"] = group["image"]
    if not shown["commands"] and "image" not in shown:
        shown["commands"] = [":"]
    return shown


def service_shown(name: str, configuration: dict, groups: list[dict]) -> dict:
    shown: dict = {"type": "service", "name": name, "port": configuration.get("port") or 80,
                   "auth": configuration.get("auth", True), "strip_prefix": configuration.get("strip_prefix", True)}
    if len(groups) == 1 and groups[0].get("name") == "0":
        shown.update(_group_shown(groups[0]))
    else:
        shown["groups"] = [{"name": g.get("name"), **_group_shown(g)} for g in groups]
    return shown


def run_object(run: Run, ssh_key_pub: str, jobs: list[Job] | None = None) -> dict:
    jobs = sorted(jobs if jobs is not None else run.current_jobs().select_related("instance"),
                  key=lambda j: j.job_num)
    rendered = [{"job_spec": job_spec(run.name, run.configuration, {**j.spec, "job_num": j.job_num}, len(jobs),
                                      job_ports(j)),
                 "job_submissions": [job_submission(j)], "job_connection_info": None}
                for j in jobs]
    latest = rendered[0]["job_submissions"][-1] if rendered else None
    message = run.status if run.status != RunStatus.SUBMITTED else "pending"
    return {
        "id": uuid_of("run", run.pk), "project_name": run.project.name, "user": user_name(run.user),
        "fleet": {"id": uuid_of("fleet", run.fleet_id), "name": run.fleet.name} if run.fleet_id else None,
        "submitted_at": _iso(run.submitted_at), "last_processed_at": _iso(run.updated), "status": run.status,
        "status_message": message, "termination_reason": run.termination_reason or None,
        "run_spec": run_spec_of(run, ssh_key_pub), "jobs": rendered, "latest_job_submission": latest,
        "cost": 0.0, "deployment_num": run.deployment_num, "error": run.termination_message or None,
        # the full URL at Muster's endpoint: dstack's client shows a full URL as it is (a gateway's way)
        "service": {"url": service_url(run), "model": None, "options": {}}
        if run.configuration.get("type") == "service" else None,
        "deleted": False,
    }


def instance_object(instance: Instance, fleet: Fleet) -> dict:
    return {
        "id": uuid_of("instance", instance.pk), "project_name": fleet.project.name,
        "backend": dstack_name(instance.backend), "instance_type": _instance_type(instance),
        "name": instance.name, "fleet_id": uuid_of("fleet", fleet.pk), "fleet_name": fleet.name,
        "instance_num": instance.index, "hostname": instance.hostname or None, "status": instance.status,
        "unreachable": instance.unreachable, "termination_reason": instance.termination_reason or None,
        "created": _iso(instance.created), "region": instance.region or instance.backend,
        "price": instance.price, "total_blocks": 1, "busy_blocks": 1 if instance.status == InstanceStatus.BUSY else 0,
    }


def fleet_configuration_shown(fleet: Fleet) -> dict:
    """A dstack fleet configuration for the fleet: hosts by address, no key (the client only shows it)."""
    conf = fleet.configuration or {}
    shown: dict = {"type": "fleet", "name": fleet.name, "placement": fleet.placement}
    ssh = conf.get("ssh_config")
    if ssh:
        shown["ssh_config"] = {"hosts": [{"hostname": h.get("hostname"), "port": h.get("port"),
                                          "user": h.get("user")} for h in ssh.get("hosts") or []]}
    elif isinstance(conf.get("nodes"), int):
        shown["nodes"] = conf["nodes"]
    return shown


def fleet_object(fleet: Fleet) -> dict:
    instances = sorted(fleet.instances.exclude(status=InstanceStatus.TERMINATED), key=lambda i: i.index)
    message = "; ".join(e.get("msg", "") for e in fleet.errors or []) or None
    return {
        "id": uuid_of("fleet", fleet.pk), "name": fleet.name, "project_name": fleet.project.name,
        "spec": {"configuration": fleet_configuration_shown(fleet), "configuration_path": None, "profile": {}},
        "created_at": _iso(fleet.created), "status": FLEET_STATUS.get(fleet.status, fleet.status),
        "status_message": message, "instances": [instance_object(i, fleet) for i in instances],
    }


def offer(instance: Instance) -> dict:
    return {"backend": dstack_name(instance.backend), "instance": _instance_type(instance),
            "region": instance.region or instance.backend, "price": instance.price,
            "availability": "idle", "instance_runtime": "shim", "blocks": 1, "total_blocks": 1}
