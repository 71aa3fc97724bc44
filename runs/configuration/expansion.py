"""From a checked task to its jobs: one global rank space over the groups, in written order."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .task_checked import TaskConfiguration


@dataclass(frozen=True)
class JobSpec:
    """One node of a run. `job_num` is its global rank; job 0 is the master."""

    job_num: int
    node_group_name: str
    node_group_index: int
    node_group_rank: int
    nodes_in_group: int
    resources: dict[str, Any]  # normalized, see resources.Resources
    commands: list[str]  # `${{ }}` references untouched: they are filled when the IPs are known
    env: dict[str, str]
    image: str | None
    ports: list[int | str] = field(default_factory=list)

    def stored_dict(self) -> dict[str, Any]:
        """What a job row keeps: its place and resources. Commands, env, image and ports are the
        group's, stored once in the run's configuration (`groups[node_group_index]`), so a group of
        a thousand nodes does not store its commands a thousand times."""
        return {
            "job_num": self.job_num,
            "node_group_name": self.node_group_name,
            "node_group_index": self.node_group_index,
            "node_group_rank": self.node_group_rank,
            "nodes_in_group": self.nodes_in_group,
            "resources": self.resources,
        }

    def as_dict(self) -> dict[str, Any]:
        """Everything a node is handed, its group's commands, env, image and ports included."""
        return {**self.stored_dict(), "commands": list(self.commands), "env": dict(self.env),
                "image": self.image, "ports": list(self.ports)}


def expanded_sizes(conf: TaskConfiguration) -> list[tuple[int, int]]:
    """(bytes of commands and env each node of the group is handed, nodes) per group: what the
    run hands out in all, once each node's runner gets its own copy."""
    return [(len(json.dumps({"commands": group.commands, "env": group.env})), group.nodes) for group in conf.groups]


def group_requirements(conf: TaskConfiguration) -> list[tuple[str, int, dict[str, Any], int]]:
    """(name, index, requirements, nodes) per group: what placement needs, without a row per job."""
    out = []
    for group in conf.groups:
        resources = group.resources.as_dict()
        if group.image:
            resources["docker"] = True  # the job runs in a container: only on hosts with Docker
        out.append((group.name, group.index, resources, group.nodes))
    return out


def stored_specs(conf: TaskConfiguration) -> list[dict[str, Any]]:
    """JobSpec.stored_dict of every job, without the JobSpecs and their copies of the commands and
    env (a submit stores only these). A service's group has `nodes` jobs per replica it starts with,
    numbered by `replica_num` within the group (node_group_rank: the node within its replica)."""
    specs: list[dict[str, Any]] = []
    for group, (name, index, resources, nodes) in zip(conf.groups, group_requirements(conf), strict=True):
        replicas = getattr(group, "desired", None)
        for replica in range(1 if replicas is None else replicas):
            for rank in range(nodes):
                spec = {"job_num": len(specs), "node_group_name": name, "node_group_index": index,
                        "node_group_rank": rank, "nodes_in_group": nodes, "resources": _copy(resources)}
                specs.append(spec if replicas is None else {**spec, "replica_num": replica})
    return specs


def replica_specs(conf: TaskConfiguration, group_name: str, replica_num: int, job_num: int) -> list[dict[str, Any]]:
    """The stored specs of one more replica of a service's group (a scale-up or a rolling update's
    new replica), as stored_specs makes them at submit: one per node of the replica (`nodes`), the
    job numbers from `job_num` on."""
    for name, index, resources, nodes in group_requirements(conf):
        if name == group_name:
            return [{"job_num": job_num + rank, "node_group_name": name, "node_group_index": index,
                     "node_group_rank": rank, "nodes_in_group": nodes, "resources": _copy(resources),
                     "replica_num": replica_num} for rank in range(nodes)]
    raise KeyError(group_name)


def expand_jobs(conf: TaskConfiguration) -> list[JobSpec]:
    jobs: list[JobSpec] = []
    for group, (_, _, resources, _) in zip(conf.groups, group_requirements(conf), strict=True):
        for rank in range(group.nodes):
            jobs.append(
                JobSpec(
                    job_num=len(jobs),
                    node_group_name=group.name,
                    node_group_index=group.index,
                    node_group_rank=rank,
                    nodes_in_group=group.nodes,
                    # Each job gets its own copies, so changing one job's dict cannot change another's.
                    resources=_copy(resources),
                    commands=list(group.commands),
                    env=dict(group.env),
                    image=group.image,
                    ports=list(group.ports),
                )
            )
    return jobs


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value
