from __future__ import annotations

import time

from django.conf import settings
from drf_spectacular.utils import extend_schema_serializer
from rest_framework import serializers

from instances.queued import queued_message, queued_view
from muster.serializers import EpochTimeField, ModelSerializer, iso_time
from runs import queue, restart_view
from runs.choices import JOB_FINISHED, JobStatus
from runs.configuration.stored import SERVER_KEYS
from runs.models import Job, Run
from runs.waits import waiting_view
from serving.replicas import replica_counts
from serving.urls_for import service_url


@extend_schema_serializer(component_name="Run")  # the schema adds `Request`: RunRequest
class RunRequestSerializer(serializers.Serializer):
    """Documents the plan/apply body; the configuration itself is validated by runs.configuration."""

    configuration = serializers.JSONField(help_text="The run configuration: YAML text or a JSON object.")
    env = serializers.DictField(child=serializers.CharField(), required=False,
                                help_text="Values for bare `KEY` entries in the configuration's env.")
    update = serializers.BooleanField(required=False, default=False, help_text=(
        "A service only: when a service of this name is running, roll it to this configuration in place "
        "(200) instead of refusing the name; without a running service of the name, a new run (201)."))


@extend_schema_serializer(component_name="Stop")  # StopRequest
class StopRequestSerializer(serializers.Serializer):
    abort = serializers.BooleanField(default=False)


class LogQuerySerializer(serializers.Serializer):
    """The query of `runs/<name>/logs`: where to read, not which rows to list, so a serializer and not
    a FilterSet. Both are bounded: a huge start overflows the file seek, a huge job number the
    database integer."""

    LOG_OFFSET_MAX = 2**62

    job = serializers.IntegerField(default=0, help_text="the job number (rank) whose log to read")
    submission = serializers.IntegerField(required=False, help_text="the submission of the job whose log to read "
                                          "(an earlier attempt's, from the run's `earlier_jobs`); default: the "
                                          "current one")
    start = serializers.IntegerField(default=0, help_text="the byte offset to read from: the `next` of the "
                                                          "previous answer")

    @staticmethod
    def _bounded(value: int, most: int) -> int:
        if not 0 <= value <= most:
            raise serializers.ValidationError(f"must be a whole number from 0 to {most}")
        return value

    def validate_job(self, value: int) -> int:
        return self._bounded(value, settings.MUSTER["MAX_NODES"])

    def validate_submission(self, value: int) -> int:
        return self._bounded(value, 2**31 - 1)

    def validate_start(self, value: int) -> int:
        return self._bounded(value, self.LOG_OFFSET_MAX)


class JobSerializer(ModelSerializer):
    instance = serializers.CharField(source="instance.name", default=None, read_only=True)
    instance_ip = serializers.CharField(source="instance.internal_ip", default=None, read_only=True)
    # the fleet the job's group was placed on (a run's groups may span fleets); null until placed
    fleet = serializers.CharField(source="fleet.name", default=None, read_only=True)
    resources = serializers.JSONField(source="spec.resources", read_only=True)
    status_message = serializers.SerializerMethodField()
    # the runner's clock as epoch seconds in the row, ISO 8601 here like every other time of the API
    start_time = EpochTimeField()
    end_time = EpochTimeField()
    probes = serializers.SerializerMethodField()
    deadline = serializers.SerializerMethodField(help_text="when Google takes the job's flex-start slice back "
                                                 "(its queued resource's max_run_duration from when it was given); "
                                                 "null for any other host")

    class Meta:
        model = Job
        fields = [
            "job_num", "submission_num", "status", "status_message", "termination_reason", "termination_message",
            "node_group_name", "node_group_index", "node_group_rank", "replica_num", "deployment_num",
            "waiting_master_job",
            "instance", "instance_ip", "fleet", "resources", "start_time", "end_time", "exit_status",
            "ready_at", "probes", "waiting_for", "deadline",
        ]

    def get_probes(self, job: Job) -> list:
        return [dict(p, last_at=iso_time(p.get("last_at"))) if isinstance(p, dict) and "last_at" in p else p
                for p in job.probes or []]

    def get_deadline(self, job: Job) -> str | None:
        if job.instance is None or job.instance.group is None or job.status in JOB_FINISHED:
            return None
        view = queued_view(job.instance.group)
        return iso_time(view.get("deadline")) if view else None

    def get_status_message(self, job: Job) -> str:
        if job.waiting_for and job.status in (JobStatus.SUBMITTED, JobStatus.PROVISIONING, JobStatus.PULLING):
            # a free host of a full fleet; a peer (startup_order, depends_on); the addresses
            return f"waiting for {job.waiting_for}"
        # What a provisioning job waits for, when the wait is the cloud's (a queued TPU slice).
        if job.status != JobStatus.PROVISIONING or job.instance is None or job.instance.group is None:
            return ""
        return queued_message(queued_view(job.instance.group), time.time())


class RunSerializer(ModelSerializer):
    fleet = serializers.CharField(source="fleet.name", default=None, read_only=True)
    project = serializers.CharField(source="project.name", read_only=True)
    jobs = serializers.SerializerMethodField()
    configuration = serializers.SerializerMethodField()
    waiting_for = serializers.SerializerMethodField(help_text="what a `submitted` run waits for when its fleet is "
                                                    "full and its retry lists no-capacity; \"\" otherwise")
    gives_up_at = serializers.SerializerMethodField(help_text="when such a waiting run stops waiting and fails "
                                                    "(its submission plus retry.duration); null otherwise")
    queue_position = serializers.SerializerMethodField(help_text="while the run waits for a free host: its place "
                                                       "among the project's waiting runs (1 is given the next "
                                                       "host: highest priority, then oldest); null otherwise")
    restarts = serializers.SerializerMethodField(help_text="per group that restarted: restarts so far, the most "
                                                 "allowed, the cause, and whether one is pending")
    earlier_jobs = serializers.SerializerMethodField(help_text="the jobs a restart or retry replaced (detail only)")
    service = serializers.SerializerMethodField(help_text="a service's URL and its replicas: ready (in the "
                                                "endpoint's pool) and total (wanted); null for a task")

    class Meta:
        model = Run
        fields = [
            "name", "project", "status", "termination_reason", "termination_message", "fleet",
            "submission_num", "retry_attempts", "next_retry_at", "submitted_at", "finished_at",
            "priority", "waiting_for", "queue_position", "gives_up_at", "restarts", "deployment_num", "serving_deployment", "service",
            "configuration", "jobs",
            "earlier_jobs",
        ]

    def get_service(self, run: Run) -> dict | None:
        if run.configuration.get("type") != "service":
            return None
        return {"url": service_url(run), "replicas": replica_counts(run, self._current(run))}

    def get_restarts(self, run: Run) -> list[dict]:
        return [dict(entry, starts_at=serializers.DateTimeField().to_representation(entry["starts_at"])
                     if entry["starts_at"] else None) for entry in restart_view.restarts(run)]

    def get_earlier_jobs(self, run: Run) -> list[dict]:
        """The jobs a group restart or a run retry replaced, oldest first: their logs stay readable
        (`logs?job=N&submission=M`)."""
        if getattr(run, "submitted_jobs", None) is not None:
            return []
        old = [j for j in run.jobs.all() if j.superseded]
        return JobSerializer(sorted(old, key=lambda j: (j.submission_num, j.job_num)), many=True).data

    def get_waiting_for(self, run: Run) -> str:
        return waiting_view(run, self._current(run)).get("waiting_for", "")

    def get_queue_position(self, run: Run) -> int | None:
        if not waiting_view(run, self._current(run)):
            return None
        # a list reads every waiting run's place of its page in one query, kept on the list serializer
        holder = self.parent if self.parent is not None else self
        found = getattr(holder, "_queue_positions", None)
        if found is None:
            runs = holder.instance if self.parent is not None else [run]
            found = queue.positions(run.project_id, [r.pk for r in runs if r.project_id == run.project_id])
            holder._queue_positions = found
        return found.get(run.pk)

    def get_gives_up_at(self, run: Run) -> str | None:
        until = waiting_view(run, self._current(run)).get("gives_up_at")
        return serializers.DateTimeField().to_representation(until) if until else None

    @staticmethod
    def _current(run: Run) -> list[Job]:
        # a run just submitted carries its new jobs (runs.services.submission), so the 201 reads nothing back
        jobs = getattr(run, "submitted_jobs", None)
        if jobs is None:
            jobs = [j for j in run.jobs.all() if not j.superseded]
        return jobs

    def get_configuration(self, run: Run) -> dict:
        # the user's configuration as stored: the server's own keys are never shown
        return {k: v for k, v in run.configuration.items() if k not in SERVER_KEYS}

    def get_jobs(self, run: Run) -> list[dict]:
        return JobSerializer(sorted(self._current(run), key=lambda j: j.job_num), many=True).data


@extend_schema_serializer(component_name="RunSummary")  # a list page: PaginatedRunSummaryList
class RunListSerializer(RunSerializer):
    class Meta(RunSerializer.Meta):
        fields = [f for f in RunSerializer.Meta.fields if f not in ("configuration", "earlier_jobs")]
