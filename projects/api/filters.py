"""The query parameters of the member list, declared once so that validation, the 400 and the
OpenAPI schema all come from the same place (django-filter, through DRF's filter backend).

The project list takes none: it is the caller's own projects, a handful, and the secret list
shows names only."""

from __future__ import annotations

import django_filters

from muster.filters import enum_filter
from projects.models import Membership, Role


class MemberFilter(django_filters.FilterSet):
    role = enum_filter(Role, "role", "only the members with this role (who are the admins?)")

    class Meta:
        model = Membership
        fields = ["role"]

    def pending(self, queryset):
        """The members with no account yet (PendingMembership rows), filtered alike: they are
        listed with the others. Call after the filter backend validated the parameters."""
        role = self.form.cleaned_data.get("role") if self.is_valid() else None
        return queryset.filter(role=role) if role else queryset
