"""TPU slices in `make chaos`: runs on hollow TPU fleets (bench/hollow_tpu.py) whose slices Google
(the fake TPU API, tests/fake_tpu/, served from the chaos process) takes back while the runs use them.

Five kinds of run, in turn: one v4-16 slice created directly, one as a queued spot resource, a
multislice set of two v4-16 slices each way, and a set of three created directly with
`on_slice_failure: replace-slice` (its preempted slice is made again alone: the run must keep its
one pod, counted as "replace-slice runs whose set was made again whole"); every run retries on
`interruption`. From the
start of the chaos until the runs have settled, a preemption every second or so picks a slice that
a running job of a run's first submission is on and preempts it (the node PREEMPTED, its queued
resource SUSPENDED), so every run is preempted at most once and its retry can finish. After settling nothing may be
left at the fake: a slice that exists with no live run on it is billed for nothing, and a queued
resource left behind holds quota.
"""

from __future__ import annotations

import threading
from typing import Any

from google.cloud import tpu_v2

from tests.fake_tpu import FakeTpuServer

ZONES = ["chaos-a", "chaos-b"]
# (fleet, slices, on_slice_failure): the last makes only the preempted slice again (the set kept)
KINDS = [("tpu-direct", 1, ""), ("tpu-queued", 1, ""), ("tpu-direct", 2, ""), ("tpu-queued", 2, ""),
         ("tpu-direct", 3, "replace-slice")]


class TpuChaos:
    def __init__(self, runs: int, rng) -> None:
        self.runs, self.rng = runs, rng
        self.fake = FakeTpuServer()
        self.fake.queued_script = {zone: ["CREATING", "WAITING_FOR_RESOURCES", "ACTIVE"] for zone in ZONES}
        self.fake.host_addresses = self._addresses
        self.preempted: list[str] = []
        self.hit: set[str] = set()  # pods preempted (or found already gone)
        self._made = 0
        self._lock = threading.Lock()

    def _addresses(self, node_id: str, hosts: int) -> list[str]:
        with self._lock:  # each slice its own addresses (hollow hosts are never dialled)
            self._made += 1
            return [f"10.{201 + self._made // 250}.{self._made % 250}.{k + 2}" for k in range(hosts)]

    def start(self) -> dict[str, str]:
        """Serve the fake; the environment the workers need to reach it."""
        self.fake.start()
        return {"MUSTER_GCP_PROJECT_ID": "chaos", "MUSTER_GCP_ZONES": ",".join(ZONES),
                "MUSTER_GCP_API_ENDPOINT": self.fake.endpoint, "MUSTER_GCP_TIMEOUT": "5",
                "MUSTER_POD_POLL_INTERVAL": "3"}  # beat expires a watch after one interval: not too short under load

    def stop(self) -> None:
        self.fake.stop()

    def submit(self, project, user) -> None:
        from bench.hollow_tpu import DIRECT, QUEUED, make_hollow_tpu_fleet
        from runs.services.submission import submit_run

        make_hollow_tpu_fleet(project, "tpu-direct", DIRECT)
        make_hollow_tpu_fleet(project, "tpu-queued", QUEUED)
        for i in range(self.runs):
            fleet, slices, on_loss = KINDS[i % len(KINDS)]
            lines = ["type: task", f"name: tpu-chaos-{i}", f"fleets: [{fleet}]", "resources: {gpu: tpu-v4-16}",
                     "commands: [echo]", "retry: {on_events: [interruption, no-capacity], duration: 10m}"]
            if slices > 1:
                lines.append(f"slices: {slices}")
            if on_loss:
                lines.append(f"on_slice_failure: {on_loss}")
            submit_run(project, user, {"configuration": "\n".join(lines) + "\n"})

    def preempt_one(self) -> str | None:
        """Preempt one slice that a running job of a run's first submission is on (each run is
        preempted at most once, so its retry can finish); the node's name, or None when none runs."""
        from instances.models import InstanceGroup
        from runs.models import Job

        running = Job.objects.filter(status="running", instance__group__kind="tpu_pod", submission_num=0,
                                     run__name__startswith="tpu-chaos-").values("instance__group")
        pods = list(InstanceGroup.objects.filter(pk__in=running, status="active").values_list("name", flat=True))
        pods = [p for p in pods if p not in self.hit]
        if not pods:
            return None
        pod = self.rng.choice(pods)
        self.hit.add(pod)
        with self.fake.lock:
            nodes = [n for n, rec in self.fake.nodes.items() if _pod_of(n) == pod and rec.node.state == tpu_v2.Node.State.READY]
        if not nodes:
            return None
        victim = self.rng.choice(nodes)
        self.fake.preempt(victim)
        self.preempted.append(victim)
        return victim

    def checks(self) -> dict[str, int]:
        from instances.models import InstanceGroup
        from runs.choices import JOB_ACTIVE
        from runs.models import Job

        groups = InstanceGroup.objects.filter(instances__jobs__status__in=[*JOB_ACTIVE, "terminating"]).distinct()
        live = {g.name for g in groups}
        # a replaced slice's node has an id of its own, which only its pod's record names
        nodes_of_live = {node_id for g in groups for node_id in _node_ids(g.name, g.backend_data)}
        with self.fake.lock:
            nodes = [n for n in self.fake.nodes if n.rsplit("/", 1)[1] not in nodes_of_live]
            queued = [n for n in self.fake.queued if n.rsplit("/", 1)[1] not in live]
        hit = Job.objects.filter(run__name__startswith="tpu-chaos-", termination_reason="interrupted_by_no_capacity")
        return {"slices billed with no run": len(nodes), "queued resources left": len(queued),
                "runs never interrupted by a preemption": 0 if hit.exists() else 1,
                "replace-slice runs whose set was made again whole": self._remade_whole()}

    def _remade_whole(self) -> int:
        """Replace-slice runs preempted once whose jobs ran on more than one pod (a whole new set)."""
        from runs.models import Job

        pods: dict[str, set[int]] = {}
        for run, group in Job.objects.filter(run__name__startswith="tpu-chaos-", instance__isnull=False,
                                             run__configuration__groups__0__on_slice_failure="replace-slice"
                                             ).values_list("run__name", "instance__group"):
            pods.setdefault(run, set()).add(group)
        return sum(1 for groups in pods.values() if len(groups) > 1)

    def summary(self) -> dict[str, Any]:
        from django.db.models import Count

        from runs.models import Run

        runs = Run.objects.filter(name__startswith="tpu-chaos-")
        return {"preemptions": len(self.preempted),
                "TPU runs by status": dict(runs.values_list("status").annotate(n=Count("id"))),
                "TPU resubmissions": sum(runs.values_list("submission_num", flat=True))}


def _node_ids(pod: str, data: dict) -> set[str]:
    """Every node id a live pod may hold: its own, its slices', and its replaced slices' new ones."""
    from backends.gcp.tpu_client import member_node_id, slice_node_id

    members = (data.get("create") or {}).get("members") or []
    slices = int(data.get("slices") or 1)
    return ({pod} | {slice_node_id(pod, i) for i in range(slices)}
            | {member_node_id(pod, i, m) for i, m in enumerate(members)})


def _pod_of(node_name: str) -> str:
    """The pod (instance group) a fake node belongs to: its id, less `-s-<i>` for a slice of a set."""
    node_id = node_name.rsplit("/", 1)[1]
    head, sep, tail = node_id.rpartition("-s-")
    return head if sep and tail.isdigit() else node_id
