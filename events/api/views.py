from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from events.models import Event
from projects.services.access import ProjectScopedMixin


class EventSerializer(serializers.ModelSerializer):
    run = serializers.CharField(source="run.name", default=None, read_only=True)

    class Meta:
        model = Event
        fields = ["created", "subject", "status", "actor", "message", "run"]


class EventListView(ProjectScopedMixin, APIView):
    @extend_schema(parameters=[OpenApiParameter("run", str), OpenApiParameter("limit", int)],
                   responses={200: EventSerializer(many=True)})
    def get(self, request, project):
        events = Event.objects.filter(project=self.project).select_related("run")
        if request.query_params.get("run"):
            events = events.filter(run__name=request.query_params["run"])
        try:
            limit = max(1, min(int(request.query_params.get("limit", 500)), 5000))
        except ValueError:
            limit = 500
        rows = list(events.order_by("-created", "-id")[:limit])[::-1]
        return Response(EventSerializer(rows, many=True).data)
