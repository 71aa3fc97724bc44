"""How an event is shown over the API (and to the CLI's `muster events`)."""

from __future__ import annotations

from rest_framework import serializers

from events.models import Event
from muster.serializers import ModelSerializer


class EventSerializer(ModelSerializer):
    run = serializers.CharField(source="run.name", default=None, read_only=True)

    class Meta:
        model = Event
        fields = ["created", "subject", "status", "actor", "message", "run"]
