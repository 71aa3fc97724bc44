"""How projects, their members and secrets are read and written over the API."""

from __future__ import annotations

from rest_framework import serializers

from projects.models import Project, Role, slug_validator


class ProjectSerializer(serializers.ModelSerializer):
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
    username = serializers.CharField(max_length=150)
    role = serializers.ChoiceField(choices=Role.values)


class SecretSerializer(serializers.Serializer):
    name = serializers.RegexField(r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=128)
    value = serializers.CharField(write_only=True, trim_whitespace=False)
