"""The query parameters of the event list, declared once so that validation, the 400 and the
OpenAPI schema all come from the same place (django-filter, through DRF's filter backend)."""

from __future__ import annotations

import django_filters
from django import forms
from drf_spectacular.utils import extend_schema_field

from events.models import Event

DEFAULT_LIMIT = 500
MOST = 5000


class LatestFilter(django_filters.Filter):
    """Keeps the latest N events. Unlike a plain filter it also acts when the parameter is absent
    (the default), because an unbounded event list would grow with every transition ever made.
    A number outside 1..MOST is clamped, as it always was; only a value that is not a whole number
    is a 400. It must be the last filter declared: nothing can filter a sliced queryset."""

    field_class = forms.IntegerField

    def filter(self, qs, value):
        count = DEFAULT_LIMIT if value is None else max(1, min(value, MOST))
        return qs.order_by("-created", "-id")[:count]


class EventFilter(django_filters.FilterSet):
    run = django_filters.CharFilter(field_name="run__name", help_text="only the events of the run with this name")
    # the schema is spelled out: drf-spectacular cannot guess the type of a filter of its own
    limit = extend_schema_field({"type": "integer", "default": DEFAULT_LIMIT,
                                 "description": f"the latest N events (1..{MOST})"})(LatestFilter())

    class Meta:
        model = Event
        fields = ["run", "limit"]
