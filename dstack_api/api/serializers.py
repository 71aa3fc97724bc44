"""The bodies dstack's client sends, checked before any service runs (a wrong type is a 400 in
dstack's error format, never a 500). Answers are rendered by dstack_api/services/render.py."""

from __future__ import annotations

from rest_framework import serializers

NAME = {"max_length": 200}
MAX_NAMES = 100


class RunNameSerializer(serializers.Serializer):
    run_name = serializers.CharField(**NAME)
    id = serializers.UUIDField(required=False, allow_null=True)


class RunNamesSerializer(serializers.Serializer):
    runs_names = serializers.ListField(child=serializers.CharField(**NAME), min_length=1, max_length=MAX_NAMES)
    abort = serializers.BooleanField(default=False)


class RunSpecSerializer(serializers.Serializer):
    run_spec = serializers.DictField()
    max_offers = serializers.IntegerField(required=False, allow_null=True, min_value=0, max_value=1000)


class ApplyRunSerializer(serializers.Serializer):
    class Plan(serializers.Serializer):
        run_spec = serializers.DictField()
        current_resource = serializers.DictField(required=False, allow_null=True)

    plan = Plan()
    force = serializers.BooleanField(default=False)


class RunListSerializer(serializers.Serializer):
    project_name = serializers.CharField(required=False, allow_null=True, **NAME)
    only_active = serializers.BooleanField(default=False)
    prev_submitted_at = serializers.DateTimeField(required=False, allow_null=True)
    limit = serializers.IntegerField(default=100, min_value=0, max_value=100)
    ascending = serializers.BooleanField(default=False)


class LogsPollSerializer(serializers.Serializer):
    run_name = serializers.CharField(**NAME)
    job_submission_id = serializers.UUIDField(required=False, allow_null=True)
    next_token = serializers.CharField(required=False, allow_null=True, max_length=32)


class RepoInitSerializer(serializers.Serializer):
    repo_id = serializers.CharField(**NAME)
    repo_info = serializers.DictField()
    repo_creds = serializers.DictField(required=False, allow_null=True)


class FleetNameSerializer(serializers.Serializer):
    name = serializers.CharField(**NAME)
    id = serializers.UUIDField(required=False, allow_null=True)


class FleetNamesSerializer(serializers.Serializer):
    names = serializers.ListField(child=serializers.CharField(**NAME), min_length=1, max_length=MAX_NAMES)


class FleetInstancesSerializer(serializers.Serializer):
    name = serializers.CharField(**NAME)
    instance_nums = serializers.ListField(child=serializers.IntegerField(min_value=0, max_value=2**31 - 1),
                                          min_length=1, max_length=MAX_NAMES)


class FleetSpecSerializer(serializers.Serializer):
    spec = serializers.DictField()


class ApplyFleetSerializer(serializers.Serializer):
    class Plan(serializers.Serializer):
        spec = serializers.DictField()
        current_resource = serializers.DictField(required=False, allow_null=True)

    plan = Plan()
    force = serializers.BooleanField(default=False)
