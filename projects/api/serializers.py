"""How projects, their members and secrets are read and written over the API."""

from __future__ import annotations

from django.contrib.auth.validators import UnicodeUsernameValidator
from rest_framework import serializers

from muster.serializers import ModelSerializer
from projects.models import Project, Role, slug_validator


class ProjectSerializer(ModelSerializer):
    role = serializers.SerializerMethodField()

    class Meta:
        model = Project
        fields = ["name", "created", "role"]
        read_only_fields = ["created", "role"]

    def get_role(self, project: Project) -> str | None:
        return project.role_of(self.context["request"].user)


class ProjectCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=63, validators=[slug_validator])


class MemberSerializer(serializers.Serializer):
    # an account's name or one to be created (projects.services.members); a name no account can
    # have is refused, whether or not accounts exist
    username = serializers.CharField(max_length=150, validators=[UnicodeUsernameValidator()])
    role = serializers.ChoiceField(choices=Role.values)


class MembershipSerializer(serializers.Serializer):
    project = serializers.CharField()
    role = serializers.ChoiceField(choices=Role.values)


class SecretSerializer(serializers.Serializer):
    name = serializers.RegexField(r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=128)
    value = serializers.CharField(write_only=True, trim_whitespace=False)
