from __future__ import annotations

from django.db.models import Prefetch
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.exceptions import NotFound
from rest_framework.generics import GenericAPIView
from rest_framework.response import Response
from rest_framework.views import APIView

from instances.api.filters import InstanceFilter
from instances.api.serializers import (
    DeleteQuerySerializer,
    FleetRequestSerializer,
    FleetSerializer,
    InstanceGroupSerializer,
    InstanceSerializer,
    SharedFleetSerializer,
)
from instances.lookup import find_group
from instances.models import Fleet, FleetStatus, GroupStatus, Instance, InstanceGroup
from instances.services import fleets, groups
from muster.text import NUL
from projects.services.access import ProjectScopedMixin, named_or_404
from runs.choices import JOB_ON_HOST
from runs.models import Job


class FleetListView(ProjectScopedMixin, APIView):
    @extend_schema(responses={200: FleetSerializer(many=True)})
    def get(self, request, project):
        own = FleetSerializer(Fleet.objects.filter(project=self.project).order_by("name"), many=True).data
        # fleets other projects share with this one (instances/shares.py), after its own
        shared = Fleet.objects.filter(shares__project=self.project).exclude(project=self.project).exclude(
            status=FleetStatus.FAILED).select_related("project").order_by("project__name", "name")
        return Response([*own, *SharedFleetSerializer(shared, many=True, context={"project_id": self.project.pk}).data])

    @extend_schema(request=FleetRequestSerializer, responses={201: FleetSerializer, 202: FleetSerializer})
    def post(self, request, project):
        # SSH hosts are contacted by a task (202, status pending): a slow host never holds this request.
        fleet = fleets.apply_fleet(self.project, request.data, actor=request.user.username, user=request.user)
        code = status.HTTP_202_ACCEPTED if fleet.status == FleetStatus.PENDING else status.HTTP_201_CREATED
        return Response({**FleetSerializer(fleet).data, "warnings": fleet.warnings}, status=code)


class FleetDetailView(ProjectScopedMixin, APIView):
    @extend_schema(responses={200: FleetSerializer})
    def get(self, request, project, name):
        return Response(FleetSerializer(named_or_404(Fleet.objects, "fleet", self.project, name)).data)

    @extend_schema(parameters=[DeleteQuerySerializer], responses={202: FleetSerializer})
    def delete(self, request, project, name):
        # Like the apply of an SSH fleet: the hosts are stopped by a claimed step (202, status
        # terminating; the fleet is gone once the step ran), never inside this request.
        fleet = named_or_404(Fleet.objects, "fleet", self.project, name)
        fleets.delete_fleet(fleet, force=DeleteQuerySerializer.force_of(request), actor=request.user.username)
        return Response(FleetSerializer(fleet).data, status=status.HTTP_202_ACCEPTED)


class InstanceListView(ProjectScopedMixin, GenericAPIView):
    """A GenericAPIView for its filter backend: InstanceFilter reads the query and the schema shows it."""

    queryset = Instance.objects.select_related("fleet", "group")
    filterset_class = InstanceFilter
    serializer_class = InstanceSerializer

    def get_queryset(self):
        busy = Job.objects.filter(status__in=JOB_ON_HOST).select_related("run")
        return super().get_queryset().filter(project=self.project).prefetch_related(
            Prefetch("jobs", queryset=busy, to_attr="busy_jobs"))

    @extend_schema(responses={200: InstanceSerializer(many=True)})
    def get(self, request, project):
        rows = self.filter_queryset(self.get_queryset()).order_by("group__name", "index", "name")
        return Response(InstanceSerializer(rows, many=True, context={"project_id": self.project.pk}).data)


class InstanceGroupListView(ProjectScopedMixin, APIView):
    @extend_schema(responses={200: InstanceGroupSerializer(many=True)})
    def get(self, request, project):
        groups = InstanceGroup.objects.filter(project=self.project).exclude(status=GroupStatus.TERMINATED)
        groups = groups.select_related("fleet").prefetch_related("instances").order_by("name")
        return Response(InstanceGroupSerializer(groups, many=True).data)


class InstanceGroupDetailView(ProjectScopedMixin, APIView):
    """`name` is the group's name or the name of any of its instances: both mean the whole group."""

    def _group(self, name: str) -> InstanceGroup:
        group = find_group(self.project, name) if NUL not in name else None  # muster/text.py
        if group is None:
            raise NotFound(f"no instance group or group member named {name}")
        return group

    @extend_schema(responses={200: InstanceGroupSerializer})
    def get(self, request, project, name):
        return Response(InstanceGroupSerializer(self._group(name)).data)

    @extend_schema(parameters=[DeleteQuerySerializer], responses={202: InstanceGroupSerializer})
    def delete(self, request, project, name):
        group = self._group(name)
        groups.delete_group(group, actor=request.user.username, force=DeleteQuerySerializer.force_of(request))
        group.refresh_from_db()
        return Response(InstanceGroupSerializer(group).data, status=status.HTTP_202_ACCEPTED)
