from __future__ import annotations

from django.db import models

from backends.registry import BACKENDS
from muster import crypto
from muster.claimable import Claimable

# The product's backends (backends/registry.py) as the column's choices: FleetBackend.SSH, .LOCAL, ...
FleetBackend = models.TextChoices("FleetBackend", [(name.upper(), name) for name in BACKENDS])


class Placement(models.TextChoices):
    ANY = "any"
    CLUSTER = "cluster"


class FleetStatus(models.TextChoices):
    PENDING = "pending"  # an SSH fleet whose hosts are being contacted (engine/registration.py)
    ACTIVE = "active"
    FAILED = "failed"  # SSH registration refused: `errors` says why; applying again replaces it
    TERMINATING = "terminating"


class Fleet(Claimable):
    """A set of hosts runs are placed on. Claimable: a `pending` SSH fleet is claimed by its registration."""

    project = models.ForeignKey("projects.Project", on_delete=models.CASCADE, related_name="fleets")
    name = models.CharField(max_length=63)
    backend = models.CharField(max_length=16, choices=FleetBackend.choices)
    placement = models.CharField(max_length=16, choices=Placement.choices, default=Placement.ANY)
    status = models.CharField(max_length=16, choices=FleetStatus.choices, default=FleetStatus.ACTIVE)
    configuration = models.JSONField(default=dict)  # the validated fleet configuration, keys removed
    private_key_encrypted = models.TextField(blank=True, default="")
    network = models.CharField(max_length=64, blank=True, default="")  # the hosts' common network (cluster)
    idle_duration = models.IntegerField(null=True, blank=True)  # seconds an idle cloud instance is kept
    errors = models.JSONField(default=list, blank=True)  # a failed registration's [{"loc", "msg"}]
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        unique_together = [("project", "name")]

    def __str__(self) -> str:
        return self.name

    @property
    def private_key(self) -> str:
        return crypto.decrypt(self.private_key_encrypted, loc=["fleets", self.name, "private_key"],
                              what=f"the SSH private key of fleet {self.name}",
                              fix="delete the fleet and apply it again with its key")

    @private_key.setter
    def private_key(self, plaintext: str) -> None:
        self.private_key_encrypted = crypto.encrypt(plaintext)


class FleetShare(models.Model):
    """A project's share of a shared fleet (its `shared_with`, and the owner's own once it shares):
    the nominal quota and the most it may borrow of what the others leave unused. None: no quota
    (or, for borrowing, nothing) on that resource. Written with the fleet, in its transaction."""

    fleet = models.ForeignKey(Fleet, on_delete=models.CASCADE, related_name="shares")
    project = models.ForeignKey("projects.Project", on_delete=models.CASCADE, related_name="fleet_shares")
    hosts = models.IntegerField(null=True, blank=True)
    gpus = models.IntegerField(null=True, blank=True)
    borrow_hosts = models.IntegerField(null=True, blank=True)
    borrow_gpus = models.IntegerField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["fleet", "project"], name="fleet_share_unique")]

    def __str__(self) -> str:
        return f"{self.fleet_id}:{self.project_id}"


class FleetQueue(Claimable):
    """The row the fleet's admission step claims (engine/admission.py): which waiting runs get the
    hosts a fleet got back is decided by one step per fleet, not by each host's release.

    `wanted` counts the releases that asked for a look (each adds one after its commit); `admitted`
    is the count the last look started from; `promised` the jobs recent looks woke. A release that comes while a look holds the row is not
    lost: the look, once given back, sees `wanted` past what it started from and is sent again.
    """

    fleet = models.OneToOneField(Fleet, on_delete=models.CASCADE, primary_key=True, related_name="queue")
    wanted = models.BigIntegerField(default=0)
    admitted = models.BigIntegerField(default=0)
    admitted_at = models.DateTimeField(null=True, blank=True)
    # {job id: when a look woke it (epoch)}: engine/admission.py's promise
    promised = models.JSONField(default=dict, blank=True)


class GroupKind(models.TextChoices):
    TPU_POD = "tpu_pod"
    CLUSTER = "cluster"


class GroupStatus(models.TextChoices):
    PROVISIONING = "provisioning"
    ACTIVE = "active"
    TERMINATING = "terminating"
    TERMINATED = "terminated"


class InstanceGroup(Claimable):
    """Instances managed as one unit: a TPU pod slice (one instance per host) or an SSH cluster."""

    project = models.ForeignKey("projects.Project", on_delete=models.CASCADE, related_name="instance_groups")
    fleet = models.ForeignKey(Fleet, null=True, blank=True, on_delete=models.SET_NULL, related_name="groups")
    name = models.CharField(max_length=63)
    kind = models.CharField(max_length=16, choices=GroupKind.choices)
    status = models.CharField(max_length=16, choices=GroupStatus.choices, default=GroupStatus.ACTIVE)
    shape = models.CharField(max_length=32, blank=True, default="")  # e.g. the TPU slice name v2-32
    backend_data = models.JSONField(default=dict, blank=True)
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["project", "name"], condition=~models.Q(status=GroupStatus.TERMINATED),
                name="live_group_name_unique",
            )
        ]

    def __str__(self) -> str:
        return self.name


class InstanceStatus(models.TextChoices):
    PENDING = "pending"
    PROVISIONING = "provisioning"
    IDLE = "idle"
    BUSY = "busy"
    TERMINATING = "terminating"
    TERMINATED = "terminated"


class InstanceReason(models.TextChoices):
    """Why an instance ended (Instance.termination_reason), when no job's reason says it. A slice
    deleted because its jobs could not start carries that JobReason (engine/pods.py `_fail_pod`),
    and a slice the cloud refused to create carries the cloud's error text (`_forget`)."""

    IDLE = "idle"  # kept idle longer than its fleet's idle_duration (engine/pods.py expire_idle_pods)
    REGISTRATION_FAILED = "registration_failed"  # its SSH fleet's registration failed (engine/ssh_registration.py)


class InstanceCondition(models.TextChoices):
    """Not a status (the instance keeps the one it has): a condition its events carry in
    Event.status, as the `unreachable` flag is set (engine/health.py)."""

    UNREACHABLE = "unreachable"


LIVE_INSTANCE_STATUSES = (
    InstanceStatus.PENDING,
    InstanceStatus.PROVISIONING,
    InstanceStatus.IDLE,
    InstanceStatus.BUSY,
)


class Instance(Claimable):
    project = models.ForeignKey("projects.Project", on_delete=models.CASCADE, related_name="instances")
    fleet = models.ForeignKey(Fleet, null=True, blank=True, on_delete=models.SET_NULL, related_name="instances")
    group = models.ForeignKey(
        InstanceGroup, null=True, blank=True, on_delete=models.SET_NULL, related_name="instances"
    )
    index = models.IntegerField(default=0)  # position in the group: the TPU worker id on a pod
    name = models.CharField(max_length=96)
    status = models.CharField(max_length=16, choices=InstanceStatus.choices, default=InstanceStatus.PENDING)
    backend = models.CharField(max_length=16, choices=FleetBackend.choices)
    region = models.CharField(max_length=64, blank=True, default="")
    hostname = models.CharField(max_length=255, blank=True, default="")
    port = models.IntegerField(default=22)
    username = models.CharField(max_length=64, blank=True, default="")
    internal_ip = models.CharField(max_length=64, blank=True, default="")
    host_key = models.TextField(blank=True, default="")
    private_key_encrypted = models.TextField(blank=True, default="")  # a per-host key, else the fleet's
    resources = models.JSONField(default=dict, blank=True)
    # Copies of the resources placement filters on, so choosing a host is an indexed query
    # instead of a scan of the fleet (kept in step by save() and resource_columns()).
    cpus = models.IntegerField(default=0)
    memory_gb = models.FloatField(default=0.0)
    gpu_count = models.IntegerField(default=0)
    tpu = models.CharField(max_length=32, blank=True, default="")
    price = models.FloatField(default=0.0)
    backend_data = models.JSONField(default=dict, blank=True)
    unreachable = models.BooleanField(default=False)
    unreachable_since = models.DateTimeField(null=True, blank=True)
    last_seen = models.DateTimeField(null=True, blank=True)
    idle_since = models.DateTimeField(null=True, blank=True)
    termination_reason = models.CharField(max_length=64, blank=True, default="")
    # The project whose job the host is busy with (or being made for), written by the statement
    # that gives it to a job and cleared by the one that makes it idle or ends it
    # (instances/transitions.py): what each project holds of a shared fleet is then a count of
    # these, not an aggregate over jobs and runs (instances/rows.held, under the fleet's lock)
    holder = models.ForeignKey("projects.Project", null=True, blank=True, on_delete=models.SET_NULL,
                               related_name="+", db_index=False)
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["project", "name"], condition=~models.Q(status=InstanceStatus.TERMINATED),
                name="live_instance_name_unique",
            )
        ]
        indexes = [
            models.Index(fields=["fleet", "status"]),
            # placement's candidate query: one fleet's idle hosts in (gpu_count, id) order, read a
            # page at a time, so picking a host reads a page, not the whole fleet
            models.Index(fields=["fleet", "status", "gpu_count", "id"], name="instance_placement_order"),
            # rows.held: each project's hosts and GPUs on a fleet, read from the index alone
            models.Index(fields=["fleet", "holder", "gpu_count"], condition=models.Q(holder__isnull=False),
                         name="instance_held"),
        ]

    def __str__(self) -> str:
        return self.name

    @staticmethod
    def resource_columns(resources: dict | None) -> dict:
        resources = resources or {}
        return {
            "cpus": int(resources.get("cpus") or 0),
            "memory_gb": float(resources.get("memory_gb") or 0.0),
            "gpu_count": len(resources.get("gpus") or []),
            "tpu": str(resources.get("tpu") or ""),
        }

    def save(self, *args, **kwargs):
        for key, value in self.resource_columns(self.resources).items():
            setattr(self, key, value)
        super().save(*args, **kwargs)

    def ssh_target(self):
        from backends.registry import ssh_target

        own_key = crypto.decrypt(self.private_key_encrypted, loc=["instances", self.name, "private_key"],
                                 what=f"the SSH private key of instance {self.name}",
                                 fix="delete its fleet and apply it again with its keys")
        fleet_key = self.fleet.private_key if self.fleet else ""
        return ssh_target(
            hostname=self.hostname,
            port=self.port,
            username=self.username or "root",
            private_key=own_key or fleet_key,
            host_key=self.host_key,
            runner_home=self.backend_data.get("runner_home", ""),
        )
