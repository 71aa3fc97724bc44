"""What a submit does differently for a service: its replica counts, its URL in the plan, and the
in-place update when a running service of the same name is applied again.

An update (the submit with `"update": true`, which `muster apply` sends once the user agreed)
stores the new configuration, raises the run's `deployment_num` and recomputes `desired_replicas`,
with an event, then nudges the run: the engine rolls the replicas to the new deployment one at a
time (new replica ready, then an old one drained and stopped); a service with a `router` group is
updated blue/green instead (engine/replicas/revisions.py), with what a rollback restores recorded in
the run's `rollout`. Nothing else of the run changes.
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from engine import messages
from events.services import update_and_record
from muster import crypto
from muster.api_errors import Conflict
from projects.models import Project
from runs.choices import RunStatus
from runs.configuration import TaskConfiguration
from runs.configuration.stored import StoredService, stored_run
from runs.models import Job, Run
from serving.urls_for import url_for

# a service in these is rolled in place; any other state (waiting to retry, stopping) is not
UPDATABLE = (RunStatus.SUBMITTED, RunStatus.PROVISIONING, RunStatus.RUNNING)
HOW_TO_UPDATE = "apply it as an update to roll the service to this configuration (`muster apply` asks; the API: " \
                "\"update\": true)"


def plan_replicas(conf: TaskConfiguration) -> dict[str, dict[str, int]] | None:
    """Per replica group: the range and how many replicas a new service starts with; None for a task."""
    if conf.type != "service":
        return None
    return {g.name: {"min": g.replicas.min, "max": g.replicas.max, "desired": g.desired}  # type: ignore[attr-defined]
            for g in conf.groups}


def planned_url(project: Project, conf: TaskConfiguration) -> str | None:
    return url_for(project.name, conf.name) if conf.name else None


def desired_at_submit(configuration: dict) -> dict[str, int]:
    stored = stored_run(configuration)
    if not isinstance(stored, StoredService):
        return {}
    return {g.name: g.replicas.min if g.replicas else 1 for g in stored.groups}


def submitted_message(run: Run, specs: list[dict]) -> str:
    if not run.desired_replicas:
        return f"submitted with {len(specs)} jobs"
    counts = ", ".join(f"{name}: {n}" for name, n in run.desired_replicas.items())
    return f"submitted with {len(specs)} replicas ({counts})"


def update_hint(existing: Run, configuration: dict) -> str:
    if existing.configuration.get("type") == "service" and configuration.get("type") == "service":
        return f", or {HOW_TO_UPDATE}"
    return ""


def updated_service(project: Project, conf: TaskConfiguration) -> dict | None:
    """What applying `conf` does to the running service of its name (the plan says it before
    the CLI asks); None when it is a new service."""
    if not conf.name:
        return None
    run = Run.objects.filter(project=project, name=conf.name).only(
        "status", "configuration", "deployment_num", "stop_requested").first()
    if run is None or run.finished:
        return None
    refused = _refusal(run, conf)
    if refused:
        return {"name": conf.name, "refused": refused}
    return {"name": conf.name, "deployment_num": run.deployment_num + 1, "status": run.status,
            "message": f"service {conf.name} is {run.status}: applying updates it in place (deployment "
                       f"{run.deployment_num + 1}): " + _how(conf)}


def _how(conf: TaskConfiguration) -> str:
    if any(getattr(g, "router", None) for g in conf.groups):
        return ("blue/green: every group of the new deployment comes up beside the serving one, the endpoint "
                "switches to the new router once all are ready, then the old deployment drains and stops; "
                "if the new one fails, it is rolled back")
    return "new replicas start and become ready before the old ones are drained and stopped, one at a time"


def _refusal(run: Run, conf: TaskConfiguration) -> str:
    kind = run.configuration.get("type") or "task"
    if kind != "service":
        return (f"run {run.name} is a {kind}: only a service is updated in place; stop it first or pick "
                "another name")
    if conf.type != "service":
        return f"run {run.name} is a service: an update must keep `type: service`; stop it first to run a {conf.type}"
    if run.stop_requested:
        return f"service {run.name} is stopping: wait until it has stopped, then submit it again"
    if run.status not in UPDATABLE:
        return f"service {run.name} is {run.status}: only a submitted, provisioning or running service is updated"
    return ""


def _desired(old: dict[str, int], conf: TaskConfiguration) -> dict[str, int]:
    """The new deployment's replicas per group: a fixed count as written; a range keeps what the
    scaler chose for that group, moved into the new range (a new group starts at its minimum)."""
    out = {}
    for group in conf.groups:
        low, high = group.replicas.min, group.replicas.max  # type: ignore[attr-defined]
        out[group.name] = min(max(old.get(group.name, low), low), high)
    return out


def update(project: Project, user, conf: TaskConfiguration, stored: dict, text: str) -> Run | None:
    """Roll the live run named `conf.name` to `stored`; None when no live run has that name (the
    submit then makes a new run). A live run that cannot be updated: a 409 that says why.

    Two applies race through the run's row lock: the second sees the first's deployment. For a
    service with a router the second supersedes the first's rollout (its replicas never served and
    are removed; a rollback still restores the deployment that serves)."""
    with transaction.atomic():
        run = Run.objects.select_for_update().select_related("project").filter(project=project, name=conf.name).first()
        if run is None or run.finished:
            return None
        refused = _refusal(run, conf)
        if refused:
            raise Conflict(["update"], refused)
        # above any deployment a job was ever made for: a rolled-back one's number is not reused
        deployment = max(run.deployment_num, _top_deployment(run)) + 1
        desired = _desired(run.desired_replicas or {}, conf)
        counts = ", ".join(f"{name}: {n}" for name, n in desired.items())
        actor = getattr(user, "username", "") or "api"
        fields = {"configuration": stored, "submitted_text": text, "deployment_num": deployment,
                  "desired_replicas": desired, "updated_at": timezone.now()}
        if _routed(stored) and not (run.rollout and run.serving_deployment < run.deployment_num) \
                and _scaled_only(run.configuration, stored):
            # a routed service whose update changes only its replica counts is scaled in place: no new
            # deployment, no second copy (scale-down drains as the scaler's does)
            fields.update(deployment_num=run.deployment_num)
            update_and_record(
                Run.objects.filter(pk=run.pk), fields, project.id, f"run {run.name}",
                f"updated by {actor}: only the replica counts changed (replicas {counts}): scaled in place, "
                f"deployment {run.deployment_num} serves on", status=run.status, actor=actor, run_id=run.pk)
            messages.process_run(run.pk)
            run.refresh_from_db()
            run.rolled = True
            return run
        if _routed(stored):
            how = _blue_green(run, deployment, fields)
        else:
            fields.update(serving_deployment=deployment, rollout={})
            how = "the replicas are rolled to it one at a time"
        update_and_record(
            Run.objects.filter(pk=run.pk), fields,
            project.id, f"run {run.name}", f"updated by {actor} to deployment {deployment} (replicas {counts}): {how}",
            status=run.status, actor=actor, run_id=run.pk)
        messages.process_run(run.pk)
    run.refresh_from_db()
    run.rolled = True
    return run


# what an update may change and still be scaled in place: the counts, and what is derived from them
_SCALING_KEYS = ("replicas", "scaling")


def _scaled_only(old: dict, new: dict) -> bool:
    """Whether `new` differs from `old` in replica counts only (the encrypted values compared as what
    they hold: each submit encrypts them anew)."""
    sealed = ("secret_env", "secret_registry_password")

    def shape(conf: dict) -> dict:
        groups = [{k: v for k, v in g.items() if k not in _SCALING_KEYS} for g in conf.get("groups") or []]
        return {**{k: v for k, v in conf.items() if k not in ("nodes", "groups", *sealed)}, "groups": groups}

    def opened(conf: dict) -> list:
        return [crypto.decrypt(conf[k], loc=[k], what=k, fix="submit the run again") if conf.get(k) else None
                for k in sealed]
    return shape(old) == shape(new) and opened(old) == opened(new)


def _routed(stored: dict) -> bool:
    conf = stored_run(stored)
    return isinstance(conf, StoredService) and conf.routed


def _blue_green(run: Run, deployment: int, fields: dict) -> str:
    """The rollout record of a routed service's update (what a rollback restores: the serving
    deployment's), kept when a rollout is under way already; the event's words."""
    how = (f"blue/green: every group of deployment {deployment} comes up beside deployment "
           f"{run.serving_deployment}, which serves until the new one is ready")
    if run.rollout and run.serving_deployment < run.deployment_num:
        return how + f" (supersedes the rollout to deployment {run.deployment_num}, whose replicas are removed)"
    fields["rollout"] = {"configuration": run.configuration, "submitted_text": run.submitted_text,
                         "desired_replicas": run.desired_replicas, "started_at": timezone.now().isoformat()}
    return how


def _top_deployment(run: Run) -> int:
    return Job.objects.filter(run_id=run.pk).order_by("-deployment_num").values_list(
        "deployment_num", flat=True).first() or 0
