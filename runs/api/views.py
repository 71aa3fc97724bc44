from __future__ import annotations

from django.conf import settings
from django.db.models import Prefetch
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.generics import GenericAPIView
from rest_framework.response import Response
from rest_framework.views import APIView

from muster.api_errors import InvalidInput
from muster.pagination import LinkHeaderCursorPagination
from projects.services.access import ProjectScopedMixin, named_or_404
from runs import queue, usage
from runs.api.filters import RunFilter
from runs.api.serializers import (
    LogQuerySerializer,
    RunListSerializer,
    RunRequestSerializer,
    RunSerializer,
    StopRequestSerializer,
)
from runs.models import Job, Run
from runs.services import attach, logs, shell
from runs.services.submission import idempotency_key_of, plan_run, submit_run
from runs.transitions import request_stop

# the jobs without their usage samples (runs/usage.py), which only runs/<name>/metrics answers with
JOBS = Prefetch("jobs", queryset=Job.objects.defer("usage"))


def _run(project, name: str) -> Run:
    return named_or_404(Run.objects.select_related("fleet", "project").prefetch_related(
        JOBS, "jobs__instance__group", "jobs__fleet"), "run", project, name)


class RunPlanView(ProjectScopedMixin, APIView):
    @extend_schema(request=RunRequestSerializer, responses={200: dict})
    def post(self, request, project):
        return Response(plan_run(self.project, request.data, request.user))


class RunListView(ProjectScopedMixin, GenericAPIView):
    """A GenericAPIView for its filter backend: RunFilter reads the query and the schema shows it."""

    queryset = Run.objects.select_related("fleet", "project").prefetch_related(JOBS, "jobs__instance__group",
                                                                               "jobs__fleet")
    filterset_class = RunFilter
    pagination_class = LinkHeaderCursorPagination
    serializer_class = RunRequestSerializer  # what POST takes; OPTIONS describes it

    def get_queryset(self):
        return super().get_queryset().filter(project=self.project)

    @extend_schema(responses={200: RunListSerializer(many=True)})
    def get(self, request, project):
        page = self.paginate_queryset(self.filter_queryset(self.get_queryset()))
        return self.get_paginated_response(RunListSerializer(page, many=True).data)

    @extend_schema(request=RunRequestSerializer, responses={201: RunSerializer},
                   parameters=[OpenApiParameter("Idempotency-Key", str, OpenApiParameter.HEADER, description=(
                       "any unique string (a UUID): sending the same submission again with it returns the run "
                       "the first one made instead of a second run"))])
    def post(self, request, project):
        key = idempotency_key_of(request.headers)
        run = submit_run(self.project, request.user, request.data, idempotency_key=key)
        headers = {"Idempotent-Replayed": "true"} if getattr(run, "replayed", False) else None
        # an update of a running service (`"update": true`) changes the run in place: 200, not 201
        code = status.HTTP_200_OK if getattr(run, "rolled", False) else status.HTTP_201_CREATED
        return Response(RunSerializer(run).data, status=code, headers=headers)


class RunDetailView(ProjectScopedMixin, APIView):
    @extend_schema(responses={200: RunSerializer})
    def get(self, request, project, name):
        return Response(RunSerializer(_run(self.project, name)).data)

    @extend_schema(responses={204: None})
    def delete(self, request, project, name):
        run = _run(self.project, name)
        if not run.finished:
            raise InvalidInput(["name"], f"run {name} is {run.status}: stop it before deleting it")
        run.delete()
        return Response(status=status.HTTP_204_NO_CONTENT)


class RunStopView(ProjectScopedMixin, APIView):
    @extend_schema(request=StopRequestSerializer, responses={200: RunSerializer})
    def post(self, request, project, name):
        body = StopRequestSerializer(data=request.data or {})
        body.is_valid(raise_exception=True)
        run = _run(self.project, name)
        request_stop(run, abort=body.validated_data["abort"], actor=request.user.username)
        return Response(RunSerializer(_run(self.project, name)).data)


class RunLogsView(ProjectScopedMixin, APIView):
    @extend_schema(parameters=[LogQuerySerializer], responses={200: dict})
    def get(self, request, project, name):
        run = _run(self.project, name)
        query = LogQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        job_num, start = query.validated_data["job"], query.validated_data["start"]
        submission = query.validated_data.get("submission")
        if submission is None:
            job = run.current_jobs().filter(job_num=job_num).first()
        else:
            job = run.jobs.filter(job_num=job_num, submission_num=submission).first()
        if job is None:
            of = "" if submission is None else f" in submission {submission} (the run's earlier_jobs lists them)"
            raise InvalidInput(["job"], f"run {name} has no job {job_num}{of}")
        data = logs.read(job, start)
        return Response({"job": job_num, "submission": job.submission_num, "start": start, "next": start + len(data),
                         "status": job.status,
                         "text": data.decode("utf-8", errors="replace"),
                         # [epoch ms, lines] of the lines beginning in text (docs/api.md)
                         "times": logs.line_times(job, start, data)})


class RunAttachView(ProjectScopedMixin, APIView):
    """A POST, so read-only members get a 403: reaching a job's ports is more than reading."""

    @extend_schema(request=dict, responses={200: dict, 202: dict})
    def post(self, request, project, name):
        body = request.data if isinstance(request.data, dict) else {}
        info = attach.attach(_run(self.project, name), _job_number(body), body.get("public_key"),
                                  actor=request.user.username, user=request.user)
        # 202: a worker installs the key on the host; GET runs/X/attach/<id> says when it is in
        return Response(info, status=202 if "id" in info else 200)


class RunSshView(ProjectScopedMixin, APIView):
    """`muster ssh`: a shell key for a job's host (runs/services/shell.py). A POST, so read-only
    members get a 403: running commands in a job is more than reading."""

    @extend_schema(request=dict, responses={202: dict})
    def post(self, request, project, name):
        body = request.data if isinstance(request.data, dict) else {}
        info = shell.shell(_run(self.project, name), _job_number(body), body.get("public_key"),
                           actor=request.user.username, user=request.user)
        # as attach: a worker installs the key; GET runs/X/attach/<id> says when it is in
        return Response(info, status=202)


def _job_number(body: dict) -> int:
    job = body.get("job", 0)
    if not isinstance(job, int) or isinstance(job, bool) or not 0 <= job <= settings.MUSTER["MAX_NODES"]:
        raise InvalidInput(["job"], f"a job number from 0 to {settings.MUSTER['MAX_NODES']}")
    return job


class RunAttachStatusView(ProjectScopedMixin, APIView):
    """An attach's install, for its own user (`muster attach` polls it after the 202)."""

    @extend_schema(responses={200: dict})
    def get(self, request, project, name, grant):
        return Response(attach.attach_status(_run(self.project, name), grant, user=request.user))


class RunMetricsView(ProjectScopedMixin, APIView):
    """Each current job's last samples of CPU, memory and GPU use on its host (runs/usage.py)."""

    @extend_schema(responses={200: dict})
    def get(self, request, project, name):
        return Response(usage.run_metrics(named_or_404(Run.objects.all(), "run", self.project, name)))


class QueueView(ProjectScopedMixin, APIView):
    """`muster queue`: the project's runs waiting for a host, in the order hosts go to them (runs/queue.py)."""

    @extend_schema(parameters=[OpenApiParameter("fleet", str, description="only the runs waiting for this fleet")],
                   responses={200: dict})
    def get(self, request, project):
        rows = queue.queue(self.project, queue.fleet_asked(self.project, request.query_params))
        return Response({"project": self.project.name,
                         "runs": [{k: v for k, v in row.items() if not k.startswith("_")} for row in rows]})
