from __future__ import annotations

from drf_spectacular.utils import extend_schema_serializer
from rest_framework import serializers

from backends.registry import GIVEN_HOSTS
from instances import shares
from instances.models import Fleet, FleetStatus, Instance, InstanceGroup, InstanceStatus
from instances.queued import queued_view
from muster.serializers import ModelSerializer, iso_time


class DeleteQuerySerializer(serializers.Serializer):
    """The query of a DELETE: `force` says how to delete, it picks no rows, so it is a serializer and
    not a FilterSet. A value that is not a boolean is a 400 rather than a silent "no"."""

    force = serializers.BooleanField(default=False, help_text="stop the jobs using it first, instead of refusing")

    @classmethod
    def force_of(cls, request) -> bool:
        query = cls(data=request.query_params)
        query.is_valid(raise_exception=True)
        return query.validated_data["force"]


@extend_schema_serializer(component_name="Fleet")  # the schema adds `Request`: FleetRequest
class FleetRequestSerializer(serializers.Serializer):
    configuration = serializers.JSONField(help_text="The fleet configuration: YAML text or a JSON object.")


OTHER_PROJECTS_JOB = "another project's job"


class InstanceSerializer(ModelSerializer):
    fleet = serializers.CharField(source="fleet.name", default=None, read_only=True)
    group = serializers.CharField(source="group.name", default=None, read_only=True)
    group_kind = serializers.CharField(source="group.kind", default=None, read_only=True)
    job = serializers.SerializerMethodField()

    class Meta:
        model = Instance
        fields = [
            "name", "fleet", "group", "group_kind", "index", "status", "backend", "region", "hostname", "port",
            "internal_ip", "resources", "price", "unreachable", "job", "created",
        ]

    def get_job(self, inst: Instance) -> str | None:
        busy = getattr(inst, "busy_jobs", None)
        if busy is None:
            return None
        if busy and busy[0].run.project_id != self.context.get("project_id", inst.project_id):
            return OTHER_PROJECTS_JOB  # a shared fleet's host: never which run of another project holds it
        return f"{busy[0].run.name}/{busy[0].job_num}" if busy else None


class InstanceGroupSerializer(ModelSerializer):
    fleet = serializers.CharField(source="fleet.name", default=None, read_only=True)
    instances = serializers.SerializerMethodField()
    queued_resource = serializers.SerializerMethodField()
    slices = serializers.SerializerMethodField()

    class Meta:
        model = InstanceGroup
        fields = ["name", "kind", "status", "shape", "slices", "fleet", "instances", "queued_resource", "created"]

    def get_slices(self, group: InstanceGroup) -> int:
        """How many TPU slices of `shape` the pod is (a multislice set: more than 1)."""
        return int((group.backend_data or {}).get("slices") or 1)

    def get_queued_resource(self, group: InstanceGroup) -> dict | None:
        view = queued_view(group)
        return dict(view, since=iso_time(view["since"])) if view else None

    def get_instances(self, group: InstanceGroup) -> list[dict]:
        rows = sorted(group.instances.all(), key=lambda i: i.index)
        return [{"name": i.name, "index": i.index, "status": i.status, "internal_ip": i.internal_ip} for i in rows]


class FleetSerializer(ModelSerializer):
    instances = serializers.SerializerMethodField()
    configuration = serializers.SerializerMethodField()
    shares = serializers.SerializerMethodField()

    class Meta:
        model = Fleet
        fields = ["name", "backend", "placement", "status", "errors", "network", "configuration", "instances",
                  "shares", "created"]

    def get_shares(self, fleet: Fleet) -> list[dict]:
        """Each project's quota, borrowing limit and what it holds (the owner's view; a project the
        fleet is shared with sees its own share only, SharedFleetSerializer)."""
        return share_rows(fleet, None)

    def get_configuration(self, fleet: Fleet) -> dict:
        conf = dict(fleet.configuration)
        ssh = conf.get("ssh_config")
        if isinstance(ssh, dict):  # keys are stored encrypted on the fleet; never echo them
            conf["ssh_config"] = {
                **{k: v for k, v in ssh.items() if k != "private_key"},
                "hosts": [{k: v for k, v in h.items() if k != "private_key"} if isinstance(h, dict) else h
                          for h in ssh.get("hosts", [])],
            }
        return conf

    def get_instances(self, fleet: Fleet) -> list[dict]:
        rows = fleet.instances.order_by("index", "name")
        if fleet.status != FleetStatus.FAILED:  # a failed registration shows every host and how far it got
            rows = rows.exclude(status=InstanceStatus.TERMINATED)
        out = []
        for i in rows:
            row = {"name": i.name, "status": i.status, "internal_ip": i.internal_ip}
            if fleet.backend == GIVEN_HOSTS:
                row.update(hostname=i.hostname, port=i.port, registration=i.backend_data.get("registration"))
            out.append(row)
        return out


def share_rows(fleet: Fleet, only_project: int | None) -> list[dict]:
    found = shares.shares_of([fleet.pk]).get(fleet.pk) or {}
    if not found:
        return []
    usage = shares.usage_of(fleet.pk)
    return [{"project": s.project, "quota": s.quota, "borrowing_limit": s.borrow,
             "usage": usage.get(p, {"hosts": 0, "gpus": 0})}
            for p, s in sorted(found.items(), key=lambda ps: ps[1].project)
            if only_project is None or p == only_project]


class SharedFleetSerializer(serializers.Serializer):
    """Another project's fleet shared with this one, as this project sees it: its owner, this
    project's share and usage, and its hosts' state (never the runs on them, nor its configuration)."""

    def to_representation(self, fleet: Fleet) -> dict:
        project_id = self.context["project_id"]
        hosts = fleet.instances.exclude(status=InstanceStatus.TERMINATED).order_by("index", "name")
        return {"name": f"{fleet.project.name}/{fleet.name}", "shared_from": fleet.project.name,
                "backend": fleet.backend, "placement": fleet.placement, "status": fleet.status,
                "shares": share_rows(fleet, project_id),
                "instances": [{"name": i.name, "status": i.status, "internal_ip": i.internal_ip,
                               "resources": i.resources} for i in hosts],
                "created": serializers.DateTimeField().to_representation(fleet.created)}
