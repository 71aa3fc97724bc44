"""A ModelSerializer that introspects its model once per class, not once per answer."""

from __future__ import annotations

import copy
from datetime import UTC, datetime

from rest_framework import serializers


class ModelSerializer(serializers.ModelSerializer):
    """DRF's ModelSerializer builds every field anew for each serializer it makes: it reads the
    model's fields, works out each one's kwargs and instantiates it. For a submitted run with 4 jobs
    that was 70 % of the time of its answer (docs/performance.md). Here the fields are built once
    per class and each serializer gets its own shallow copies of them: binding sets the copy's
    name and parent, so no two serializers (nor two threads) share a bound field.

    For serializers whose fields do not depend on the instance, the request or the context: a
    class that decides its fields per use overrides get_fields itself."""

    def get_fields(self):
        built = type(self).__dict__.get("_fields_built_once")
        if built is None:
            built = super().get_fields()
            type(self)._fields_built_once = built  # a race builds it twice; either copy is right
        # a nested serializer binds its child too: that one gets a deep copy
        return {name: copy.deepcopy(field) if isinstance(field, serializers.BaseSerializer) else copy.copy(field)
                for name, field in built.items()}


def iso_time(epoch: float | None) -> str | None:
    """A time the runner or a cloud poll keeps as epoch seconds, as the API writes every time: ISO 8601
    in UTC, as DRF renders a DateTimeField (so `start_time` reads like `submitted_at`)."""
    if epoch is None:
        return None
    return serializers.DateTimeField().to_representation(datetime.fromtimestamp(float(epoch), tz=UTC))


class EpochTimeField(serializers.Field):
    """A read-only FloatField of epoch seconds (Job.start_time, Job.end_time) shown as `iso_time`."""

    def __init__(self, **kwargs):
        super().__init__(read_only=True, **kwargs)

    def to_representation(self, value):
        return iso_time(value)
