from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from muster.api_errors import InvalidInput
from projects.access import ProjectScopedMixin
from runs import logs, stopping
from runs.api.serializers import RunListSerializer, RunRequestSerializer, RunSerializer, StopRequestSerializer
from runs.choices import RunStatus
from runs.models import Run
from runs.services.submission import plan_run, submit_run


def _run(project, name: str) -> Run:
    return get_object_or_404(
        Run.objects.select_related("fleet", "project").prefetch_related("jobs__instance"), project=project, name=name
    )


class RunPlanView(ProjectScopedMixin, APIView):
    @extend_schema(request=RunRequestSerializer, responses={200: dict})
    def post(self, request, project):
        return Response(plan_run(self.project, request.data))


class RunListView(ProjectScopedMixin, APIView):
    @extend_schema(
        parameters=[OpenApiParameter("status", str, enum=list(RunStatus.values))],
        responses={200: RunListSerializer(many=True)},
    )
    def get(self, request, project):
        runs = Run.objects.filter(project=self.project).select_related("fleet", "project").prefetch_related("jobs__instance")
        wanted = request.query_params.get("status")
        if wanted:
            if wanted not in RunStatus.values:
                raise ValidationError({"status": [f"unknown status; one of {', '.join(RunStatus.values)}"]})
            runs = runs.filter(status=wanted)
        return Response(RunListSerializer(runs.order_by("-submitted_at"), many=True).data)

    @extend_schema(request=RunRequestSerializer, responses={201: RunSerializer})
    def post(self, request, project):
        run = submit_run(self.project, request.user, request.data)
        return Response(RunSerializer(run).data, status=status.HTTP_201_CREATED)


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
        stopping.request_stop(run, abort=body.validated_data["abort"], actor=request.user.username)
        return Response(RunSerializer(_run(self.project, name)).data)


class RunLogsView(ProjectScopedMixin, APIView):
    @extend_schema(
        parameters=[OpenApiParameter("job", int), OpenApiParameter("start", int)],
        responses={200: dict},
    )
    def get(self, request, project, name):
        run = _run(self.project, name)
        try:
            job_num = int(request.query_params.get("job", 0))
            start = int(request.query_params.get("start", 0))
        except ValueError as exc:
            raise ValidationError({"job": ["job and start must be integers"]}) from exc
        if start < 0:
            raise ValidationError({"start": ["must be 0 or more"]})
        job = run.current_jobs().filter(job_num=job_num).first()
        if job is None:
            raise InvalidInput(["job"], f"run {name} has no job {job_num}")
        data = logs.read(job, start)
        return Response({"job": job_num, "start": start, "next": start + len(data), "status": job.status,
                         "text": data.decode("utf-8", errors="replace")})
