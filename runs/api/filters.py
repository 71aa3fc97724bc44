"""The query parameters of the run list, declared once so that validation, the 400 and the OpenAPI
schema all come from the same place (django-filter, through DRF's filter backend)."""

from __future__ import annotations

import django_filters

from muster.filters import enum_filter
from runs.choices import RunStatus
from runs.models import Run


class RunFilter(django_filters.FilterSet):
    status = enum_filter(RunStatus, "status", "only runs in this status")

    class Meta:
        model = Run
        fields = ["status"]
