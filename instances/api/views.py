from __future__ import annotations

from django.db.models import Prefetch
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from engine import groups
from instances import fleets
from instances.api.serializers import (
    FleetRequestSerializer,
    FleetSerializer,
    InstanceGroupSerializer,
    InstanceSerializer,
)
from instances.models import Fleet, Instance, InstanceGroup, InstanceStatus
from projects.access import ProjectScopedMixin
from runs.models import Job


def _force(request) -> bool:
    return str(request.query_params.get("force", "")).lower() in ("1", "true", "yes")


class FleetListView(ProjectScopedMixin, APIView):
    @extend_schema(responses={200: FleetSerializer(many=True)})
    def get(self, request, project):
        return Response(FleetSerializer(Fleet.objects.filter(project=self.project).order_by("name"), many=True).data)

    @extend_schema(request=FleetRequestSerializer, responses={201: FleetSerializer, 202: FleetSerializer})
    def post(self, request, project):
        # SSH hosts are contacted by a task (202, status pending): a slow host never holds this request.
        fleet = fleets.apply_fleet(self.project, request.data, actor=request.user.username, user=request.user,
                                   wait=False)
        code = status.HTTP_202_ACCEPTED if fleet.status == "pending" else status.HTTP_201_CREATED
        return Response({**FleetSerializer(fleet).data, "warnings": fleet.warnings}, status=code)


class FleetDetailView(ProjectScopedMixin, APIView):
    @extend_schema(responses={200: FleetSerializer})
    def get(self, request, project, name):
        return Response(FleetSerializer(get_object_or_404(Fleet, project=self.project, name=name)).data)

    @extend_schema(parameters=[OpenApiParameter("force", bool)], responses={204: None})
    def delete(self, request, project, name):
        fleet = get_object_or_404(Fleet, project=self.project, name=name)
        fleets.delete_fleet(fleet, force=_force(request), actor=request.user.username)
        return Response(status=status.HTTP_204_NO_CONTENT)


class InstanceListView(ProjectScopedMixin, APIView):
    @extend_schema(
        parameters=[OpenApiParameter("fleet", str), OpenApiParameter("group", str),
                    OpenApiParameter("status", str, enum=list(InstanceStatus.values))],
        responses={200: InstanceSerializer(many=True)},
    )
    def get(self, request, project):
        busy = Job.objects.filter(status__in=["provisioning", "pulling", "running", "terminating"]).select_related("run")
        rows = Instance.objects.filter(project=self.project).select_related("fleet", "group").prefetch_related(
            Prefetch("jobs", queryset=busy, to_attr="busy_jobs"))
        params = request.query_params
        if params.get("fleet"):
            rows = rows.filter(fleet__name=params["fleet"])
        if params.get("group"):
            rows = rows.filter(group__name=params["group"])
        if params.get("status"):
            if params["status"] not in InstanceStatus.values:
                raise ValidationError({"status": [f"unknown status; one of {', '.join(InstanceStatus.values)}"]})
            rows = rows.filter(status=params["status"])
        else:
            rows = rows.exclude(status=InstanceStatus.TERMINATED)
        rows = rows.order_by("group__name", "index", "name")
        return Response(InstanceSerializer(rows, many=True).data)


class InstanceGroupListView(ProjectScopedMixin, APIView):
    @extend_schema(responses={200: InstanceGroupSerializer(many=True)})
    def get(self, request, project):
        groups = InstanceGroup.objects.filter(project=self.project).exclude(status="terminated")
        groups = groups.select_related("fleet").prefetch_related("instances").order_by("name")
        return Response(InstanceGroupSerializer(groups, many=True).data)


class InstanceGroupDetailView(ProjectScopedMixin, APIView):
    """`name` is the group's name or the name of any of its instances: both mean the whole group."""

    def _group(self, name: str) -> InstanceGroup:
        group = groups.find_group(self.project, name)
        if group is None:
            raise NotFound(f"no instance group or group member named {name}")
        return group

    @extend_schema(responses={200: InstanceGroupSerializer})
    def get(self, request, project, name):
        return Response(InstanceGroupSerializer(self._group(name)).data)

    @extend_schema(parameters=[OpenApiParameter("force", bool)], responses={202: InstanceGroupSerializer})
    def delete(self, request, project, name):
        group = self._group(name)
        groups.delete_group(group, actor=request.user.username, force=_force(request))
        group.refresh_from_db()
        return Response(InstanceGroupSerializer(group).data, status=status.HTTP_202_ACCEPTED)
