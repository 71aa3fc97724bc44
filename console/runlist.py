"""The runs list: which runs a user sees, filtered by status, a page at a time, and what each row says."""

from __future__ import annotations

from django.core.paginator import Paginator

from console import words
from muster.api_errors import InvalidInput
from runs import waits
from runs.choices import JobStatus, RunStatus
from runs.models import Job, Run

PER_PAGE = 50


def status_filter(raw: str | None) -> str:
    """The status asked for ("" for all); an unknown one is an error that names the choices."""
    if not raw:
        return ""
    if raw not in RunStatus.values:
        raise InvalidInput(["status"], f"unknown status {raw[:40]!r}: use one of {', '.join(RunStatus.values)}")
    return raw


def page_number(raw: str | None) -> int:
    if raw in (None, ""):
        return 1
    if not raw.isdigit() or not 1 <= int(raw) <= 1_000_000:
        raise InvalidInput(["page"], "must be a whole number from 1")
    return int(raw)


def gpus(configuration: dict) -> str:
    """What the run asks for over all its nodes, from its configuration: `4x A100`, `tpu v2-32`."""
    wanted: dict[str, int] = {}
    for group in (configuration or {}).get("groups") or []:
        gpu = (group.get("resources") or {}).get("gpu") or {}
        nodes = int(group.get("nodes") or 0)
        if gpu.get("tpu"):
            label = f"tpu {gpu['tpu']}" if isinstance(gpu["tpu"], str) else "tpu"
            wanted[label] = wanted.get(label, 0) + 1
            continue
        count = ((gpu.get("count") or {}).get("min") or 0) * nodes
        if count:
            label = "/".join(gpu.get("names") or []) or gpu.get("vendor") or "GPU"
            wanted[label] = wanted.get(label, 0) + count
    return ", ".join(f"{label}" if label.startswith("tpu") else f"{n}x {label}" for label, n in wanted.items()) or "-"


def requested(configuration: dict, key: str, unit: str = "") -> str:
    """What all the run's nodes ask for of `cpu` or `memory` (GB): `8`, or `8+` when more may be given."""
    total, more = 0.0, False
    for group in (configuration or {}).get("groups") or []:
        wanted = (group.get("resources") or {}).get(key) or {}
        total += (wanted.get("min") or 0) * int(group.get("nodes") or 0)
        more = more or wanted.get("max") != wanted.get("min")
    if not total:
        return "-"
    return f"{int(total) if float(total).is_integer() else round(total, 1)}{unit}{'+' if more else ''}"


def nodes(configuration: dict) -> int:
    return sum(int(g.get("nodes") or 0) for g in (configuration or {}).get("groups") or [])


def runs_page(projects, status: str, number: int, now):
    """The page of runs (newest first) and one dict per row; a page past the last is the last."""
    # the submitted text is the run page's, not the list's (up to MAX_CHARS a run)
    runs = (Run.objects.filter(project__in=projects).select_related("project", "fleet", "user")
            .defer("submitted_text").order_by("-submitted_at", "-id"))
    if status:
        runs = runs.filter(status=status)
    page = Paginator(runs, PER_PAGE).get_page(number)
    waiting = _waiting(page.object_list)
    rows = [{"run": run, "nodes": nodes(run.configuration), "gpus": gpus(run.configuration),
             "cpu": requested(run.configuration, "cpu"), "memory": requested(run.configuration, "memory", "GB"),
             "user": run.user.username if run.user else "-", "duration": words.run_duration(run, now),
             "waiting": waiting.get(run.pk, {}), "replicas": sum((run.desired_replicas or {}).values())}
            for run in page.object_list]
    return page, rows


def _waiting(runs) -> dict[int, dict]:
    """waits.waiting_view of the page's runs that wait for a free host: one read for the page."""
    submitted = {run.pk: run for run in runs if run.status == RunStatus.SUBMITTED}
    if not submitted:
        return {}
    jobs = Job.objects.filter(run_id__in=submitted, superseded=False, status=JobStatus.SUBMITTED,
                              waiting_for__startswith=waits.PREFIX).only("run_id", "status", "superseded", "waiting_for")
    found: dict[int, dict] = {}
    for job in jobs:
        if job.run_id not in found:
            found[job.run_id] = waits.waiting_view(submitted[job.run_id], [job])
    return found
