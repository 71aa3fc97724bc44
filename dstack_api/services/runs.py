"""dstack's run calls, each through the service the native API uses for the same action."""

from __future__ import annotations

import base64
import itertools
from datetime import UTC, datetime

from dstack_api.services import keys, render, translate
from dstack_api.services.errors import DstackError, NotFound
from instances.models import Instance
from muster.api_errors import InvalidInput
from projects.models import Membership, Project
from runs.choices import RUN_FINISHED
from runs.configuration.interpolation import secret_names
from runs.models import Job, Run
from runs.services import logs
from runs.services.submission import plan_run, submit_run
from runs.transitions import request_stop

MAX_LIST = 100


def _run(project: Project, name: str) -> Run:
    run = Run.objects.select_related("fleet", "project", "user").filter(project=project, name=name).first()
    if run is None:
        raise NotFound("Run not found")
    return run


def get(project: Project, user, name: str) -> dict:
    return render.run_object(_run(project, name), keys.public_key_of(user))


def _payload(run_spec: dict) -> dict:
    """dstack's CLI resolves bare env keys on the client and sends every value in the configuration,
    so a secret cannot be told from a setting: every value goes as the request's env, which Muster
    stores encrypted and shows masked, as for a bare key (a `${{ secrets.NAME }}` stays as written)."""
    conf = translate.task_configuration(run_spec)
    env = conf.get("env")
    if not isinstance(env, dict):
        return {"configuration": conf}
    values = {k: v for k, v in env.items() if isinstance(v, str) and not secret_names(v)}
    conf["env"] = {k: (None if k in values else v) for k, v in env.items()}
    return {"configuration": conf, "env": values}


def plan(project: Project, user, run_spec: dict, max_offers: int) -> dict:
    ssh_key_pub = keys.public_key_of(user)
    planned = plan_run(project, _payload(run_spec), user)
    conf = planned["configuration"]
    name = run_spec.get("run_name") or conf.get("name")
    specs = [{**j, "resources": (conf["groups"][j["node_group_index"]].get("resources"))} for j in planned["jobs"]]
    hosts = planned["capacity"].get("hosts") or {}
    fitting = {name_: list(Instance.objects.filter(project=project, name__in=names).order_by("name"))
               for name_, names in hosts.items()}
    job_plans = []
    per_replica = 1 if planned.get("replicas") is not None else len(specs)  # a service's replica is one job
    for spec in specs:
        offers = fitting.get(spec["node_group_name"], [])
        job_plans.append({"job_spec": render.job_spec(name or "run", conf, spec, per_replica),
                          "offers": [render.offer(i) for i in offers[:max_offers]], "total_offers": len(offers),
                          "max_price": None})
    current = Run.objects.select_related("fleet", "project", "user").filter(project=project, name=name).first() \
        if name else None
    spec_back = {**run_spec, "ssh_key_pub": ssh_key_pub}
    return {"project_name": project.name, "user": user.username, "run_spec": spec_back,
            "effective_run_spec": spec_back, "job_plans": job_plans,
            "current_resource": render.run_object(current, ssh_key_pub) if current else None,
            # a running service of the name is updated in place (dstack's CLI then asks "Update the run?")
            "action": "update" if (planned.get("updates") or {}).get("deployment_num") else "create"}


def _implied_key(run_spec: dict, current: dict | None) -> str | None:
    """The Idempotency-Key of an apply without one: the plan it applies (the run's name, and the run
    the plan saw there, or none). dstack's client retries a request whose connection broke, so an
    apply whose answer was lost comes again with the same plan: it gets the run the first one made
    instead of "run NAME is still submitted". A new plan over that run (dstack stops it first) names
    it as its current_resource, so it is a new key and a new run. The space keeps these keys apart
    from any a client sends (the header allows none)."""
    name = run_spec.get("run_name") or (run_spec.get("configuration") or {}).get("name")
    if not isinstance(name, str) or not name:
        return None  # a generated name: nothing to clash with, as a native submission without a key
    over = current.get("id") if isinstance(current, dict) else None
    # an update keeps the run's id: its deployment tells one update of it from the next
    deployment = current.get("deployment_num") if isinstance(current, dict) else None
    return f"dstack apply {name[:100]} over {str(over)[:64] if over else 'nothing'}" + (
        f" deployment {deployment}" if deployment else "")


def apply(project: Project, user, plan: dict, header_key: str | None = None) -> tuple[dict, bool]:
    """The submitted run (dstack's shape), and whether it is the run an earlier apply made."""
    run_spec = plan["run_spec"]
    key = header_key or _implied_key(run_spec, plan.get("current_resource"))
    payload = _payload(run_spec)
    if payload["configuration"].get("type") == "service" and plan.get("current_resource"):
        payload["update"] = True  # the plan's running service: rolled in place (nothing running: a new run)
    try:
        run = submit_run(project, user, payload, idempotency_key=key)
    except InvalidInput as exc:
        if header_key is None and exc.errors[0]["loc"] == ["headers", "Idempotency-Key"]:
            raise DstackError("Failed to apply plan. Resource has been changed: another apply submitted this run "
                              "meanwhile with another configuration. Run `dstack apply` again.") from None
        raise
    replayed = getattr(run, "replayed", False)
    run = Run.objects.select_related("fleet", "project", "user").get(pk=run.pk)
    return render.run_object(run, keys.public_key_of(user)), replayed


def stop(project: Project, user, names: list[str], abort: bool) -> None:
    runs = [_run(project, name) for name in names]  # all found, or nothing stopped
    for run in runs:
        request_stop(run, abort=abort, actor=user.username)


def delete(project: Project, names: list[str]) -> None:
    runs = [_run(project, name) for name in names]
    active = [r.name for r in runs if not r.finished]
    if active:
        raise DstackError(f"Cannot delete active runs: {active}")
    for run in runs:
        run.delete()


def listed(user, project_name: str | None, only_active: bool, limit: int, prev_submitted_at: datetime | None,
           ascending: bool) -> list[dict]:
    """The caller's projects' runs, newest first, a page at a time (dstack's keyset paging)."""
    runs = Run.objects.select_related("fleet", "project", "user")
    if not user.is_superuser:
        runs = runs.filter(project__in=Membership.objects.filter(user=user).values("project"))
    if project_name:
        runs = runs.filter(project__name=project_name)
    if only_active:
        runs = runs.exclude(status__in=RUN_FINISHED)
    if prev_submitted_at is not None:
        runs = runs.filter(submitted_at__gt=prev_submitted_at) if ascending \
            else runs.filter(submitted_at__lt=prev_submitted_at)
    runs = runs.order_by("submitted_at" if ascending else "-submitted_at")[:min(limit, MAX_LIST)]
    key = keys.public_key_of(user)
    return [render.run_object(run, key) for run in runs]


# bytes of log one poll answers at most: dstack pages with next_token until it is null
POLL_BYTES = 256 << 10


def poll_logs(project: Project, name: str, submission_id: str, next_token: str | None) -> dict:
    run = _run(project, name)
    job = Job.objects.filter(run=run, uuid=submission_id).first() if submission_id else None
    if job is None:
        raise NotFound(f"Run {name} has no job submission {submission_id}")
    try:
        start = int(next_token) if next_token else 0
    except ValueError:
        raise DstackError("next_token: send the next_token of the previous answer") from None
    if not 0 <= start <= 2**62:
        raise DstackError("next_token: send the next_token of the previous answer")
    data = logs.read(job, start, limit=POLL_BYTES)
    if not data:
        return {"logs": [], "next_token": None, "external_url": None}
    stamp = datetime.fromtimestamp(job.start_time, tz=UTC).isoformat() \
        if job.start_time else render._iso(job.created)
    lines = data.splitlines(keepends=True)
    # each event's time: when the runner received its first byte (a copy without times: the job's start)
    positions = list(itertools.accumulate([start, *(len(line) for line in lines[:-1])]))
    stamps = [datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat() for ms in
              logs.times_at(job, start, data, positions) or []] or [stamp] * len(lines)
    return {"logs": [{"timestamp": at, "log_source": "stdout", "message": base64.b64encode(line).decode()}
                     for at, line in zip(stamps, lines, strict=True)],
            "next_token": str(start + len(data)), "external_url": None}

