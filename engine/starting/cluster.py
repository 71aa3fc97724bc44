"""What a job is told when it starts: its interpolated commands and env, and the cluster info."""

from __future__ import annotations

from django.conf import settings

from backends.registry import compute_class
from engine.nudges import is_service
from engine.starting.ordering import probes_of
from instances.models import GroupKind, InstanceStatus
from muster import crypto
from runner import protocol
from runs.configuration import gpu_count_for, substitute_ips
from runs.configuration.container_policy import fleet_policy
from runs.configuration.stored import run_configuration
from runs.job_rows import secret_env
from runs.models import Job
from runs.stop_grace import stop_grace


def replica_of(job: Job, jobs: list[Job]) -> list[Job]:
    """The job's peers: the run's current jobs, or for a service's replica the jobs of that replica
    only (N for a multi-host replica, `nodes: N`, in rank order), so a replica starts without
    waiting for the others, is told nothing of them and has its own rank space. A replica is told
    apart by its node 0's job number too (engine/replicas/nodes.py key): a node of an earlier replica
    of the same number, still stopping, is not its peer."""
    if not is_service(job.run):
        return jobs
    base = job.job_num - job.node_group_rank
    return [j for j in jobs if j.node_group_index == job.node_group_index and j.replica_num == job.replica_num
            and j.deployment_num == job.deployment_num and j.job_num - j.node_group_rank == base]


def peer_ips(jobs: list[Job]) -> dict[tuple[int, int], str]:
    return {(j.node_group_index, j.node_group_rank): j.instance.internal_ip for j in jobs if j.instance}


def all_ips_known(jobs: list[Job]) -> bool:
    # A peer that already finished keeps its address; only hosts still being created have none yet.
    return all(j.instance is not None and j.instance.internal_ip and j.instance.status != InstanceStatus.PROVISIONING
               for j in jobs)


def gpus_on_host(job: Job, multi_node: bool = False) -> int:
    """GPUs the job counts as its own. A node of a multi-node run has its whole host to itself, so
    it counts every GPU of the host it got, as dstack does (DSTACK_GPUS_PER_NODE, hostfile slots);
    a single node counts what it asked for, up to its count's upper bound."""
    if multi_node:
        return gpu_count_for({}, job.instance.resources)
    return gpu_count_for(job.spec["resources"], job.instance.resources)


def group_commands_and_env(job: Job) -> tuple[list[str], dict[str, str]]:
    """The job's commands and env (its group's, kept once in the run's configuration), with the
    values of masked keys from the encrypted store."""
    run = job.run
    conf = run_configuration(run)
    group = conf.group(job.node_group_index)
    keys = [k for k in conf.server.hidden_env if k in group.env]
    env = {k: v for k, v in group.env.items() if k not in keys}
    hidden = secret_env(run) if keys else {}
    return list(group.commands), {**{k: hidden[k] for k in keys if k in hidden}, **env}


def runner_spec(job: Job, jobs: list[Job]) -> dict:
    """The spec the runner receives (runner/protocol.py: SPEC_FIELDS documents each field)."""
    run = job.run
    ips = peer_ips(jobs)
    commands, env = group_commands_and_env(job)
    env = {k: substitute_ips(v, ips) for k, v in env.items()}
    instance = job.instance
    spec = {
        "job_id": job.runner_job_id,
        "run_name": run.name,
        "job_num": job.job_num,
        # the node's place among `jobs`: a task's job_num, a service replica's node_group_rank
        "node_rank": next((i for i, j in enumerate(jobs) if j.pk == job.pk), 0),
        "nodes_num": len(jobs),
        "node_group_name": job.node_group_name,
        "node_group_index": job.node_group_index,
        "node_group_rank": job.node_group_rank,
        "commands": [substitute_ips(c, ips) for c in commands],
        "env": env,
        "max_duration": run_configuration(run).max_duration,
        "stop_grace": stop_grace(run),
        "node_ip": instance.internal_ip,
        "gpus": gpus_on_host(job, len(jobs) > 1),
        "cluster_info": {
            "job_ips": [j.instance.internal_ip for j in jobs],
            "master_job_ip": jobs[0].instance.internal_ip,
            "gpus_per_node": [gpus_on_host(j, len(jobs) > 1) for j in jobs],
        },
        "tpu": None,
        "container": None,
        # run by the job runner against 127.0.0.1 once the job runs (runner/probes.py)
        "probes": [p.model_dump(mode="json") for p in probes_of(job)] or None,
        "log_limit": int(settings.MUSTER["JOB_LOG_LIMIT"]),
    }
    if instance.group_id and instance.group.kind == GroupKind.TPU_POD:
        spec["tpu"] = tpu_spec(instance)
    spec["container"] = container_spec(job, tpu=spec["tpu"] is not None)
    return protocol.job_spec(**spec)


def tpu_spec(instance) -> dict | None:
    """What the job is told about its host's group, by the backend that made it (None: nothing)."""
    hosts = list(instance.group.instances.order_by("index").values_list("internal_ip", flat=True))
    return compute_class(instance.backend).group_env(hosts, instance.index, instance.group.backend_data)


def group_image(job: Job) -> str | None:
    return run_configuration(job.run).group(job.node_group_index).image


def container_spec(job: Job, tpu: bool = False) -> dict | None:
    """How the runner starts the job's container (runner/containers.py), or None: no image, so
    the commands run on the host."""
    image = group_image(job)
    if not image:
        return None
    conf = run_configuration(job.run)
    keys = conf.container
    vendors = {g.get("vendor") for g in (job.instance.resources or {}).get("gpus") or []}
    shm = (job.spec.get("resources") or {}).get("shm_size") or conf.group(job.node_group_index).resources.shm_size
    return {
        "image": image,
        # a TPU VM's chips are devices the TPU runtime opens directly, as dstack runs them
        "privileged": keys.privileged or tpu,
        "user": keys.user,
        "entrypoint": keys.entrypoint,
        "working_dir": keys.working_dir,
        "shell": keys.shell,
        "volumes": [f"{v.instance_path or v.path}:{v.path}" for v in keys.volumes],
        "shm_size": shm,
        "gpus": "nvidia" if "nvidia" in vendors else "amd" if "amd" in vendors else None,
        "pull_timeout": float(settings.MUSTER["IMAGE_PULL_TIMEOUT"]),
        "registry_auth": registry_auth(job),
        # the fleet's operator's limits, which the runner enforces again on the host (with symlinks resolved)
        "policy": policy_of(job.instance),
    }


def policy_of(instance) -> dict:
    fleet = instance.fleet
    # an instance left without its fleet gets the defaults of its backend
    return fleet_policy(fleet.configuration if fleet else {}, fleet.backend if fleet else instance.backend)


def registry_auth(job: Job) -> dict | None:
    """registry_auth with its password, for the runner's pull (it keeps it in memory only)."""
    conf = run_configuration(job.run)
    auth = conf.container.registry_auth
    if auth is None or not conf.server.registry_password:
        return None
    password = crypto.decrypt(conf.server.registry_password, loc=["runs", job.run.name, "registry_auth"],
                              what=f"the registry password of run {job.run.name}", fix="submit the run again")
    return {"username": auth.username, "password": password}
