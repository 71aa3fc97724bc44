from __future__ import annotations

from django.db import IntegrityError, transaction
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.generics import GenericAPIView
from rest_framework.response import Response
from rest_framework.views import APIView

from muster.api_errors import InvalidInput
from projects.api.filters import MemberFilter
from projects.api.serializers import (
    MemberSerializer,
    MembershipSerializer,
    ProjectCreateSerializer,
    ProjectSerializer,
    SecretSerializer,
)
from projects.models import Membership, Project, Role, Secret
from projects.services import members
from projects.services.access import ProjectScopedMixin, named_or_404, project_for, require_admin


class ProjectListView(APIView):
    @extend_schema(responses={200: ProjectSerializer(many=True)})
    def get(self, request):
        projects = Project.objects.all() if request.user.is_superuser else Project.objects.filter(
            memberships__user=request.user)
        return Response(ProjectSerializer(projects.order_by("name"), many=True, context={"request": request}).data)

    @extend_schema(request=ProjectCreateSerializer, responses={201: ProjectSerializer})
    def post(self, request):
        body = ProjectCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        name = body.validated_data["name"]
        taken = InvalidInput(["name"], f"project {name} already exists")
        try:
            with transaction.atomic():
                if Project.objects.filter(name=name).exists():
                    raise taken
                project = Project.objects.create(name=name)
                Membership.objects.create(project=project, user=request.user, role=Role.ADMIN)
        except IntegrityError:
            # a concurrent create of the same name committed between the check and the insert
            raise taken from None
        return Response(ProjectSerializer(project, context={"request": request}).data, status=status.HTTP_201_CREATED)


class ProjectDetailView(APIView):
    @extend_schema(responses={200: ProjectSerializer})
    def get(self, request, project):
        return Response(ProjectSerializer(project_for(request, project), context={"request": request}).data)


class MemberListView(ProjectScopedMixin, GenericAPIView):
    """A GenericAPIView for its filter backend: MemberFilter reads the query and the schema shows it."""

    queryset = Membership.objects.select_related("user")
    filterset_class = MemberFilter
    serializer_class = MemberSerializer  # what POST takes; OPTIONS describes it

    def get_queryset(self):
        return super().get_queryset().filter(project=self.project)

    @extend_schema(responses={200: MemberSerializer(many=True)})
    def get(self, request, project):
        queryset = self.get_queryset()
        rows = self.filter_queryset(queryset)  # validates ?role= (a 400 naming it)
        filterset = DjangoFilterBackend().get_filterset(request, queryset, self)
        return Response(members.member_rows(rows, filterset.pending(self.project.pending_memberships.all())))

    @extend_schema(request=MemberSerializer, responses={201: MemberSerializer})
    def post(self, request, project):
        require_admin(request, self.project)
        body = MemberSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        members.add_member(self.project, body.validated_data["username"], body.validated_data["role"])
        return Response(body.validated_data, status=status.HTTP_201_CREATED)


class MyMembershipListView(APIView):
    """The caller's own memberships: a user someone added to a project finds it here."""

    @extend_schema(responses={200: MembershipSerializer(many=True)})
    def get(self, request):
        return Response(members.memberships_of(request.user))


class MyMembershipDetailView(APIView):
    @extend_schema(responses={204: None})
    def delete(self, request, project):
        """Leave the project."""
        members.leave(request.user, project)
        return Response(status=status.HTTP_204_NO_CONTENT)


class SecretListView(ProjectScopedMixin, APIView):
    @extend_schema(responses={200: dict})
    def get(self, request, project):
        return Response([{"name": s.name, "created": s.created} for s in self.project.secrets.order_by("name")])

    @extend_schema(request=SecretSerializer, responses={201: dict})
    def post(self, request, project):
        require_admin(request, self.project)
        body = SecretSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        secret = Secret.objects.filter(project=self.project, name=body.validated_data["name"]).first() or Secret(
            project=self.project, name=body.validated_data["name"])
        secret.value = body.validated_data["value"]
        secret.save()
        return Response({"name": secret.name}, status=status.HTTP_201_CREATED)


class SecretDetailView(ProjectScopedMixin, APIView):
    @extend_schema(responses={204: None})
    def delete(self, request, project, name):
        require_admin(request, self.project)
        named_or_404(Secret.objects, "secret", self.project, name).delete()
        return Response(status=status.HTTP_204_NO_CONTENT)
