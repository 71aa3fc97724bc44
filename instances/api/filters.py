"""The query parameters of the instance list, declared once so that validation, the 400 and the
OpenAPI schema all come from the same place (django-filter, through DRF's filter backend)."""

from __future__ import annotations

import django_filters

from instances.models import Instance, InstanceStatus
from muster.filters import enum_filter


class InstanceFilter(django_filters.FilterSet):
    """Filters combine. Without `status` the terminated instances are left out: they are history
    (a deleted fleet's hosts stay listed under `status=terminated`), not what is there now."""

    fleet = django_filters.CharFilter(field_name="fleet__name", help_text="only the instances of this fleet")
    group = django_filters.CharFilter(field_name="group__name", help_text="only the instances of this group")
    status = enum_filter(InstanceStatus, "status", "only instances in this status (default: all but terminated)")

    class Meta:
        model = Instance
        fields = ["fleet", "group", "status"]

    def filter_queryset(self, queryset):
        queryset = super().filter_queryset(queryset)
        if not self.form.cleaned_data.get("status"):
            queryset = queryset.exclude(status=InstanceStatus.TERMINATED)
        return queryset
