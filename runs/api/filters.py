"""The query parameters of the run list, declared once so that validation, the 400 and the OpenAPI
schema all come from the same place (django-filter, through DRF's filter backend)."""

from __future__ import annotations

import django_filters

from runs.choices import RunStatus
from runs.models import Run


class RunFilter(django_filters.FilterSet):
    status = django_filters.ChoiceFilter(
        choices=RunStatus.choices, help_text="only runs in this status",
        # the message names the statuses there are, which Django's default one does not
        error_messages={"invalid_choice": f"unknown status; one of {', '.join(RunStatus.values)}"},
    )

    class Meta:
        model = Run
        fields = ["status"]
