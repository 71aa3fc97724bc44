"""A PD service's router worker lists: what each router replica should list, and how what it lists
differs from that. The rules; the step that reads the routers and writes to them is
engine/router_sync.py (docs/services.md, "PD services").

A service with a group of `router: {type: smg}` gets the endpoint's traffic on that group's ready
heads only (serving/routes.py). Each such router R lists exactly the ready heads of the other groups
of R's own deployment (`deployment_num`: two revisions never meet in one router) that are not
drained, each at `http://<its instance's own address>:<service port>` (what the router dials: the
address IP_ADDRESS interpolates, DSTACK_NODE_IP), with its role:

    the group's `worker.role`  >  what the worker reports (SGLang's /server_info
    `disaggregation_mode`, as dstack 0.22.5 probes it)  >  the group's name (`prefill`, `decode`)
    >  regular

and, for a prefill, its bootstrap port: `worker.bootstrap_port` > the reported
`disaggregation_bootstrap_port` > none (the router's default). A listed worker whose URL, role or
bootstrap port differ, or that was registered for another job (label `muster.job`), is removed and
the right one added.

When a router serves (`serves`): smg answers 503 until it lists a ready worker of each role it needs,
so the endpoint routes to a router only once a sync saw it, since it last became ready, list as
healthy and ready every worker it should, with at least one replica of each worker group among them
(RouterSync.routable; serving/routes.py). With no worker ready at all no router serves: the endpoint
answers its own 503 "no ready replica" (or waits for a cold start), clearer than smg's. Once marked
a router stays routable until it is no longer ready (a worker leaving later is the sync's to remove).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from runs.configuration.stored import StoredGroup, StoredService
from runs.models import Job
from serving.models import RouterSync
from serving.replicas import is_head, is_ready

JOB_LABEL = "muster.job"
ROLES = ("prefill", "decode", "regular")
# what RouterSync.listed holds for a router that has not answered since it became a router: it may
# list anything, so keep.py counts it as listing every worker (until ROUTER_DRAIN_WAIT)
UNANSWERED = "?"
# a worker id the sync may put in a DELETE's path (smg's are UUIDs)
_WORKER_ID = re.compile(r"[A-Za-z0-9._:~-]{1,128}")


@dataclass(frozen=True)
class Registration:
    """One worker as a router should list it (the body of smg's POST /workers)."""

    job_id: int
    url: str
    role: str
    bootstrap_port: int | None = None
    model: str | None = None

    def body(self) -> dict:
        body: dict = {"url": self.url, "worker_type": self.role, "connection_mode": "http",
                      "runtime_type": "sglang", "labels": {JOB_LABEL: str(self.job_id)}}
        if self.role == "prefill" and self.bootstrap_port is not None:
            body["bootstrap_port"] = self.bootstrap_port
        if self.model:
            body["model_id"] = self.model
        return body

    def describe(self) -> str:
        port = f" (bootstrap port {self.bootstrap_port})" if self.role == "prefill" and self.bootstrap_port else ""
        return f"{self.url} as {self.role}{port}"


def router_group(conf) -> StoredGroup | None:
    """The service's group whose worker list Muster keeps (smg's), or None."""
    if not isinstance(conf, StoredService):
        return None
    return next((g for g in conf.groups if g.router == "smg"), None)


def routed_group(conf) -> str | None:
    """The group the endpoint sends to: the router group of any type, None for a service without one."""
    if not isinstance(conf, StoredService):
        return None
    return next((g.name for g in conf.groups if g.router is not None), None)


def routers(group: StoredGroup, jobs: list[Job]) -> list[Job]:
    """The router replicas whose lists are kept: the router group's ready heads."""
    return [j for j in jobs if j.node_group_name == group.name and is_head(j) and is_ready(j)]


def workers_for(group: StoredGroup, jobs: list[Job], router: Job) -> list[Job]:
    """What `router` should list: the other groups' ready, undrained heads of its own deployment."""
    return sorted((j for j in jobs if j.node_group_name != group.name and is_head(j) and is_ready(j)
                   and j.drain_at is None and j.deployment_num == router.deployment_num
                   and j.instance is not None and (j.instance.internal_ip or j.instance.hostname)),
                  key=lambda j: j.pk)


def serves(conf: StoredService, group: StoredGroup, workers: list[Job], current: list[dict], port: int) -> bool:
    """Whether a router listing `current` (valid_entries) can serve: it lists, healthy and ready, each
    of `workers` (what it should list) and they hold a replica of every worker group (smg in PD mode
    answers 503 without a prefill and a decode). A router with no worker group serves once it answers."""
    needed = {g.name for g in conf.groups if g.name != group.name}
    if needed - {j.node_group_name for j in workers}:
        return False
    taken = {e["url"] for e in current if e["healthy"] and e["status"] in ("ready", "") and entry_job(e) is not None}
    return all(worker_url(j, port) in taken for j in workers)


def ready_mark(router: Job) -> str:
    """What RouterSync.routable holds for a router: its readiness, so a restart (ready again) starts over."""
    return router.ready_at.isoformat() if router.ready_at is not None else ""


def routable(run_id: int) -> dict[str, str]:
    """RouterSync.routable of the run: {router job id: ready_mark} of the routers a sync saw serve."""
    return RouterSync.objects.filter(pk=run_id).values_list("routable", flat=True).first() or {}


def worker_url(job: Job, port: int) -> str:
    host = job.instance.internal_ip or job.instance.hostname
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def role_of(override, reported: dict | None, group_name: str) -> tuple[str, int | None]:
    """(role, bootstrap port) by the rule in the module docstring. `override`: the group's
    StoredWorker or None; `reported`: the worker's /server_info answer, None when it gave none."""
    reported = reported if isinstance(reported, dict) else {}
    mode = reported.get("disaggregation_mode")
    if override is not None and override.role:
        role = override.role
    elif mode in ("prefill", "decode"):
        role = mode
    elif reported.get("status") is not None and mode in ("null", None):
        role = "regular"  # an SGLang server that answered says it is not disaggregated: its word wins
    elif group_name in ("prefill", "decode"):
        role = group_name
    else:
        role = "regular"
    port = None
    if role == "prefill":
        port = override.bootstrap_port if override is not None and override.bootstrap_port else None
        if port is None and isinstance(reported.get("disaggregation_bootstrap_port"), int):
            port = reported["disaggregation_bootstrap_port"]
    return role, port


def valid_entries(current: list) -> list[dict]:
    """A router's worker list as the rules read it: every entry a dict of strings (an `id` fit for a
    DELETE's path or "", a `url`, a `worker_type`, a `status`), `labels` a dict, `bootstrap_port` an
    int or None; anything else a router answers (it is the user's code) is not read as more."""
    out = []
    for entry in current:
        if not isinstance(entry, dict):
            continue
        worker_id = entry.get("id")
        worker_id = str(worker_id) if isinstance(worker_id, str | int) and not isinstance(worker_id, bool) else ""
        kind = entry.get("worker_type", "regular")
        port = entry.get("bootstrap_port")
        labels = entry.get("labels")
        out.append({"id": worker_id if _WORKER_ID.fullmatch(worker_id) else "",
                    "healthy": entry.get("is_healthy", True) is not False,
                    "url": entry["url"] if isinstance(entry.get("url"), str) else "",
                    "worker_type": kind if isinstance(kind, str) else "",
                    "status": entry["status"] if isinstance(entry.get("status"), str) else "",
                    "bootstrap_port": port if isinstance(port, int) and not isinstance(port, bool) else None,
                    "labels": labels if isinstance(labels, dict) else {}})
    return out


def worker_id(value) -> str:
    """A worker id a router acknowledged, "" when it is not one the sync may use."""
    text = str(value) if isinstance(value, str | int) and not isinstance(value, bool) else ""
    return text if _WORKER_ID.fullmatch(text) else ""


def entry_job(entry: dict) -> int | None:
    """The job a router's listed worker was registered for (our label), None for one we did not add."""
    value = (entry.get("labels") or {}).get(JOB_LABEL)
    return int(value) if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) < 19 else None


def matches(entry: dict, reg: Registration) -> bool:
    if entry.get("url") != reg.url or entry.get("worker_type", "regular") != reg.role:
        return False
    if reg.role == "prefill" and reg.bootstrap_port is not None and entry.get("bootstrap_port") != reg.bootstrap_port:
        return False
    job = entry_job(entry)
    return job is None or job == reg.job_id


def draining(entry: dict) -> bool:
    """A worker the router is already removing (smg lists it as draining until its requests end)."""
    return entry.get("status") == "draining"


def diff(current: list[dict], wanted: list[Registration]) -> tuple[list[Registration], list[dict]]:
    """(to add, to remove): `wanted` not listed as it should be; listed entries not wanted (or wanted
    otherwise). Entries being drained are neither: the router is removing them already."""
    live = [e for e in current if not draining(e)]
    add = [reg for reg in wanted if not any(matches(e, reg) for e in live)]
    keep: list[int] = []
    for reg in wanted:
        found = next((i for i, e in enumerate(live) if i not in keep and matches(e, reg)), None)
        if found is not None:
            keep.append(found)
    return add, [e for i, e in enumerate(live) if i not in keep]


def listed_jobs(current: list[dict], added: dict[int, str]) -> dict[str, str]:
    """{worker job id: router worker id} a router lists after a sync: what it listed, the ones just
    removed too (smg drains them: they still receive their last requests until it lets them go, seen
    at the next sync), and what was added."""
    out = {str(j): str(e.get("id", "")) for e in current if (j := entry_job(e)) is not None}
    out.update({str(job): worker_id for job, worker_id in added.items()})
    return out


def still_listed(run_id: int, job_id: int) -> list[str]:
    """The router jobs that listed `job_id` at the last sync (keep.py stops a drained replica once none
    does). A router that did not answer that sync keeps what it listed before (engine/router_sync.py);
    one that never answered counts as listing it."""
    row = RouterSync.objects.filter(pk=run_id).values_list("listed", flat=True).first() or {}
    return sorted(router for router, workers in row.items()
                  if str(job_id) in (workers or {}) or UNANSWERED in (workers or {}))
