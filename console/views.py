"""The console: server-rendered pages over the same functions the REST API uses."""

from __future__ import annotations

import re

import yaml
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Prefetch, Q
from django.http import Http404, HttpResponseBadRequest, JsonResponse, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from console import fleet_queue, logview, picture, runlist, usage_words, words
from events.models import Event
from instances.models import Fleet, FleetStatus, GroupKind, Instance, InstanceStatus
from instances.queued import queued_view
from muster.api_errors import InvalidInput
from muster.text import NUL
from muster.throttling import throttled
from projects.models import Membership, Project
from projects.services.access import WRITE_ROLES, named_or_404
from runs import restart_view
from runs.api.serializers import RunSerializer
from runs.choices import JOB_ON_HOST, RunStatus
from runs.models import Job, Run
from runs.services import logs, submitted_text
from runs.transitions import request_stop
from serving.replicas import is_ready, service_view

LOG_OFFSET_MAX = 2**62


def _member_project(request, name: str) -> tuple[Project, str | None]:
    """The project if the user may see it (404 otherwise, as the API does) and the user's role."""
    # a NUL cannot be in a stored name, and PostgreSQL refuses it in a query (muster/text.py)
    project = Project.objects.filter(name=name).first() if NUL not in name else None
    if project is None:
        raise Http404("project not found")
    role = Membership.objects.filter(project=project, user=request.user).values_list("role", flat=True).first()
    if role is None and not request.user.is_superuser:
        raise Http404("project not found")
    return project, role


def _can_stop(request, role: str | None) -> bool:
    return request.user.is_superuser or role in WRITE_ROLES


def _run(project: Project, name: str) -> Run:
    return named_or_404(Run.objects.select_related("project", "fleet"), "run", project, name)


def _jobs(run: Run) -> list[Job]:
    return list(run.current_jobs().select_related("instance", "instance__group"))


@login_required
@require_GET
def index(request):
    projects = Project.objects.order_by("name")
    if not request.user.is_superuser:
        projects = projects.filter(memberships__user=request.user)
    try:
        status = runlist.status_filter(request.GET.get("status"))
        number = runlist.page_number(request.GET.get("page"))
    except InvalidInput as exc:
        return JsonResponse({"errors": exc.errors}, status=400)
    page, rows = runlist.runs_page(projects, status, number, timezone.now())
    return render(request, "console/index.html", {"page": page, "rows": rows, "projects": projects,
                                                  "status": status, "statuses": RunStatus.values})


def _status_context(request, project: Project, run: Run, role: str | None) -> dict:
    jobs = _jobs(run)
    now = timezone.now()
    restarts = restart_view.restarts(run)
    counts = {entry["group"]: entry["restarts"] for entry in restarts}
    # the attempts a group restart or a run retry replaced: their logs stay readable
    earlier = list(run.jobs.filter(superseded=True).select_related("instance").order_by("submission_num", "job_num"))
    for job in jobs:
        job.is_ready = is_ready(job)
    for job in [*jobs, *earlier]:
        job.exit_text, job.duration_text = words.job_exit(job), words.job_duration(job, now)
        job.restart_count = counts.get(job.node_group_name, 0)
        job.uses = usage_words.cells(job)
    return {
        "project": project, "run": run, "jobs": jobs, "svg": picture.render(run, jobs, now),
        "restarts": restarts, "earlier_jobs": earlier,
        "run_duration": words.run_duration(run, now),
        # newest first: on a long run the page opens on what just happened
        "events": Event.objects.filter(run=run).order_by("-created", "-id")[:500],
        "can_stop": _can_stop(request, role) and not run.finished,
        "service": service_view(run, jobs),
    }


@login_required
@require_GET
def run_page(request, project, name):
    project, role = _member_project(request, project)
    run = _run(project, name)
    context = _status_context(request, project, run, role)
    context["configuration"] = submitted_text.shown(run)
    if not context["configuration"]:
        # a run submitted before the text was kept: the normalised configuration, as the API shows it
        context["normalised"] = True
        context["configuration"] = yaml.safe_dump(RunSerializer().get_configuration(run), sort_keys=False,
                                                  allow_unicode=True)
    return render(request, "console/run.html", context)


@login_required
@require_GET
def run_status(request, project, name):
    project, role = _member_project(request, project)
    run = _run(project, name)
    return render(request, "console/_run_status.html", _status_context(request, project, run, role))


def _whole_number(raw: str | None, most: int) -> int | None:
    if raw is None or not re.fullmatch(r"[0-9]{1,20}", raw) or int(raw) > most:
        return None
    return int(raw)


@login_required
@require_GET
@throttled  # as the API's log reads: a reader in the console must not get more than one through the API
def run_log(request, project, name):
    project, _ = _member_project(request, project)
    run = _run(project, name)
    job_num = _whole_number(request.GET.get("job", "0"), 1 << 30)
    start = _whole_number(request.GET.get("start", "0"), LOG_OFFSET_MAX)
    submission = _whole_number(request.GET.get("submission", "0"), 1 << 30)
    if job_num is None or start is None or submission is None:
        return HttpResponseBadRequest("job, start and submission must be whole numbers")
    job = _job_of(run, job_num, request.GET.get("submission"))
    if job is None:
        raise Http404("no such job")
    data = logs.read(job, start)
    return JsonResponse({"job": job_num, "start": start, "next": start + len(data), "status": job.status,
                         "finished": job.finished, "text": data.decode("utf-8", errors="replace"),
                         "times": logs.line_times(job, start, data)})


def _job_of(run: Run, job_num: int, submission: str | None) -> Job | None:
    """The current job of that number, or with `submission` (checked a whole number) an earlier attempt's."""
    jobs = run.jobs.select_related("instance", "run").filter(job_num=job_num)
    if submission in (None, ""):
        return jobs.filter(superseded=False).first()
    return jobs.filter(submission_num=int(submission)).first()


@login_required
@require_GET
def run_log_download(request, project, name):
    """The whole log as text: one job's (`?job=N`) or every job's with `[group/rank]` prefixes."""
    project, _ = _member_project(request, project)
    run = _run(project, name)
    jobs = list(run.current_jobs().select_related("instance", "run"))
    job = None
    if request.GET.get("job") not in (None, ""):
        job_num = _whole_number(request.GET.get("job"), 1 << 30)
        if job_num is None or _whole_number(request.GET.get("submission", "0"), 1 << 30) is None:
            return JsonResponse({"errors": [{"loc": ["job"], "msg": "must be a job's number (0, 1, ...) "
                                             "or left out for every job, and submission a whole number"}]},
                                status=400)
        job = _job_of(run, job_num, request.GET.get("submission"))
        if job is None:
            raise Http404("no such job")
    body = logview.whole(job) if job is not None else logview.prefixed(jobs)
    response = StreamingHttpResponse(body, content_type="text/plain; charset=utf-8")
    # an earlier attempt's log is read where it is linked (the run page's earlier attempts), not saved
    shown = "inline" if job is not None and job.superseded else "attachment"
    response["Content-Disposition"] = f'{shown}; filename="{logview.filename(run, job)}"'
    response["X-Content-Type-Options"] = "nosniff"
    return response


@login_required
@require_POST
def run_stop(request, project, name):
    project, role = _member_project(request, project)
    if not _can_stop(request, role):
        raise PermissionDenied(f"your role in project {project.name} is {role}: it cannot stop runs")
    run = _run(project, name)
    request_stop(run, abort=request.POST.get("abort") == "1", actor=request.user.username)
    return redirect("console:run", project=project.name, name=run.name)


@login_required
@require_GET
def fleets_page(request, project):
    project, _ = _member_project(request, project)
    busy = Prefetch("jobs", queryset=Job.objects.filter(status__in=JOB_ON_HOST).select_related("run"),
                    to_attr="busy_jobs")
    instances = (Instance.objects.filter(project=project).exclude(status=InstanceStatus.TERMINATED)
                 .select_related("group", "fleet").prefetch_related(busy).order_by("fleet__name", "group__name",
                                                                                   "index", "name"))
    fleets: dict[int | None, dict] = {}
    for fleet in Fleet.objects.filter(project=project).order_by("name"):
        fleets[fleet.pk] = {"fleet": fleet, "pods": {}, "hosts": []}
    for inst in instances:
        entry = fleets.setdefault(inst.fleet_id, {"fleet": None, "pods": {}, "hosts": []})
        if inst.group is not None and inst.group.kind == GroupKind.TPU_POD:
            entry["pods"].setdefault(inst.group.pk, {"group": inst.group, "hosts": [],
                                                     "queued": queued_view(inst.group)})["hosts"].append(inst)
        else:
            entry["hosts"].append(inst)
    # fleets other projects share with this one, after its own (as the API's list): its share, its
    # waiting runs, how many live hosts; never the hosts' jobs, which are the owner's and others'
    shared = list(Fleet.objects.filter(shares__project=project).exclude(project=project)
                  .exclude(status=FleetStatus.FAILED).select_related("project").order_by("project__name", "name")
                  .annotate(live=Count("instances", filter=~Q(instances__status=InstanceStatus.TERMINATED))))
    for fleet in shared:
        fleet.shared_from = fleet.project.name
    shown = fleet_queue.fleet_views(project, [e["fleet"] for e in fleets.values() if e["fleet"] is not None] + shared)
    for entry in fleets.values():
        entry["pods"] = list(entry["pods"].values())
        if entry["fleet"] is not None:
            entry.update(shown[entry["fleet"].pk], live=len(entry["hosts"]) + sum(len(p["hosts"]) for p in entry["pods"]))
    borrowed = [{"fleet": f, "pods": [], "hosts": [], "shared_from": f.shared_from, "live": f.live, **shown[f.pk]}
                for f in shared]
    return render(request, "console/fleets.html", {"project": project, "fleets": [*fleets.values(), *borrowed]})
