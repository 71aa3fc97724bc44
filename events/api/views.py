from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.generics import GenericAPIView
from rest_framework.response import Response

from events.api.filters import EventFilter
from events.api.serializers import EventSerializer
from events.models import Event
from projects.services.access import ProjectScopedMixin


class EventListView(ProjectScopedMixin, GenericAPIView):
    """The latest events, oldest first: EventFilter picks the latest ones, this reverses them."""

    queryset = Event.objects.select_related("run")
    filterset_class = EventFilter
    serializer_class = EventSerializer

    def get_queryset(self):
        return super().get_queryset().filter(project=self.project)

    @extend_schema(responses={200: EventSerializer(many=True)})
    def get(self, request, project):
        rows = list(self.filter_queryset(self.get_queryset()))[::-1]
        return Response(EventSerializer(rows, many=True).data)
