from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models

from muster.claimable import Claimable
from runs.choices import JOB_ACTIVE, JOB_FINISHED, RUN_FINISHED, JobStatus, RunStatus


class Run(Claimable):
    project = models.ForeignKey("projects.Project", on_delete=models.CASCADE, related_name="runs")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    name = models.CharField(max_length=63)
    configuration = models.JSONField()  # validated, env resolved (secret values never stored here)
    # the configuration as the user sent it, secret env masked (runs/services/submitted_text.py)
    submitted_text = models.TextField(blank=True, default="")
    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.SUBMITTED)
    termination_reason = models.CharField(max_length=32, blank=True, default="")
    termination_message = models.TextField(blank=True, default="")
    stop_requested = models.CharField(max_length=16, blank=True, default="")  # "", "stop" or "abort"
    fleet = models.ForeignKey("instances.Fleet", null=True, blank=True, on_delete=models.SET_NULL)
    submission_num = models.IntegerField(default=0)
    retry_attempts = models.IntegerField(default=0)
    # When the next retry is due: the whole run's (pending) or a group's restart (engine/restarts.py)
    next_retry_at = models.DateTimeField(null=True, blank=True)
    # Per group index: {"count": restarts so far, "submission": the group's submission being
    # restarted, "due": ISO time}; written by process_run only (it holds the run), so never lost
    restarts = models.JSONField(default=dict, blank=True)
    # dstack's `priority` (0..100): of the runs waiting for a host of a full fleet, a host given back goes
    # to the highest, then the oldest (engine/submitted/waiting.py, runs/queue.py)
    priority = models.SmallIntegerField(default=0)
    submitted_at = models.DateTimeField(auto_now_add=True)
    # when a job of the run first ran (a retry keeps the first): the end of its wait in the queue
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated = models.DateTimeField(auto_now=True)
    # When process_run last read the jobs: a job that changed after it is one the sweep must look
    # at (a lost nudge); a run whose jobs are all quiet costs the sweep nothing however long it runs.
    derived_at = models.DateTimeField(null=True, blank=True)
    # A service's revision: a rolling update (re-applying the service) raises it, and its replicas
    # of older deployments are replaced one at a time. 0 for tasks.
    deployment_num = models.IntegerField(default=0)
    # A service's wanted replicas per replica group name ({"prefill": 2}), kept by the engine:
    # set at submit from `replicas`, changed by the scaler and by an update. Empty for tasks.
    desired_replicas = models.JSONField(default=dict, blank=True)
    # When an update last changed the service (its deployment, its replicas): an update writes without
    # the run's lease, so its nudge may bounce off a process_run that read the run before it; the sweep
    # derives a run updated after its last derivation. Null for tasks.
    updated_at = models.DateTimeField(null=True, blank=True)
    # A service with a `router` group: the deployment whose routers the endpoint sends to. An update
    # of such a service brings the new deployment up beside this one (blue/green) and switches the
    # endpoint in one write once it is ready (engine/replicas/revisions.py); equal to deployment_num
    # outside a rollout, and for a service without a router (rolled replica by replica).
    serving_deployment = models.IntegerField(default=0)
    # While a routed service's rollout is under way: what rolling it back restores (the serving
    # deployment's configuration, submitted text and desired_replicas) and when it began. Empty otherwise.
    rollout = models.JSONField(default=dict, blank=True)
    # What the scaler remembers between its looks (the last request count sample, when it last
    # scaled up or down); written only by the step that holds the run.
    scaling = models.JSONField(default=dict, blank=True)

    class Meta:
        unique_together = [("project", "name")]
        # the queue's order (runs/queue.py): a project's unfinished runs by priority, then age, read in
        # that order so a wake stops at the first run that waits rather than sorting them all
        indexes = [models.Index(fields=["status"]),
                   models.Index(fields=["project", "-priority", "submitted_at", "id"], name="run_queue_order",
                                condition=~models.Q(status__in=[s.value for s in RUN_FINISHED])),
                   # the runs that may be preempted (few, beside every run): a waiting run that finds
                   # its fleet full asks for them on every look (engine/submitted/preemption.py)
                   models.Index(fields=["project", "status", "priority"], name="run_preemptible",
                                condition=models.Q(configuration__profile__preemptible=True))]

    def __str__(self) -> str:
        return self.name

    @property
    def finished(self) -> bool:
        return self.status in RUN_FINISHED

    def current_jobs(self):
        # one row per node: a group restart gives its nodes a new submission and leaves the others'
        return self.jobs.filter(superseded=False).order_by("job_num")


class Job(Claimable):
    # Not indexed here, unlike other claimable rows: the watch writes the lease and next_check_at of
    # every running job twice a look (its claim and its give-back), and a write that changes no
    # indexed column is a heap-only update in PostgreSQL, one that changes one adds an entry to each
    # of the table's indexes. What filters on them filters on the job's status first.
    lease_until = models.DateTimeField(null=True, blank=True)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="jobs")
    job_num = models.IntegerField()  # the node's global rank
    # The job's identity on its host (runner job directory) and in log storage: names (run, fleet,
    # instance) are unique only within a project and are reused by a new run of the same name.
    uuid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    submission_num = models.IntegerField(default=0)
    # a later submission of this node exists (a run retry or a restart of its group): history only
    superseded = models.BooleanField(default=False)
    # the job ended but its host stays busy for its group's restart on the same host (error): the
    # restart takes it over, and any other end of the run hands it back
    keep_host = models.BooleanField(default=False)
    status = models.CharField(max_length=16, choices=JobStatus.choices, default=JobStatus.SUBMITTED)
    termination_reason = models.CharField(max_length=48, blank=True, default="")
    termination_message = models.TextField(blank=True, default="")
    waiting_master_job = models.BooleanField(default=False)
    node_group_name = models.CharField(max_length=40)
    node_group_index = models.IntegerField(default=0)
    node_group_rank = models.IntegerField(default=0)
    spec = models.JSONField()  # resources, commands, env, image, ports of the job's group
    # The fleet job 0's placement chose for this job's group: a run's groups may go to different
    # fleets (a CPU router on an SSH fleet, a TPU slice on a gcp fleet). Null until placed.
    fleet = models.ForeignKey("instances.Fleet", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    instance = models.ForeignKey(
        "instances.Instance", null=True, blank=True, on_delete=models.SET_NULL, related_name="jobs"
    )
    status_changed_at = models.DateTimeField(auto_now_add=True)
    agent_seen_at = models.DateTimeField(null=True, blank=True)
    runner_submitted = models.BooleanField(default=False)
    start_time = models.FloatField(null=True, blank=True)  # as the runner recorded it (epoch seconds)
    end_time = models.FloatField(null=True, blank=True)
    exit_status = models.IntegerField(null=True, blank=True)
    next_check_at = models.DateTimeField(null=True, blank=True)  # not indexed: see lease_until
    # Readiness (engine/running/readiness.py): when every probe of its group had passed
    # `ready_after` times in a row (or, without probes, when it ran); each probe's last result as
    # its runner reported it; and what a starting job waits for before it may start.
    ready_at = models.DateTimeField(null=True, blank=True)
    probes = models.JSONField(default=list, blank=True)
    waiting_for = models.CharField(max_length=200, blank=True, default="")
    # the fleet a waiting job 0 waits for (engine/submitted/waiting.py `wait`; cleared by `placed`)
    waiting_fleet = models.ForeignKey("instances.Fleet", null=True, blank=True, on_delete=models.SET_NULL,
                                      related_name="+")
    # how long it waited for a free host (from its making to its placement), written by the UPDATE that
    # placed it (engine/submitted/waiting.placed); null: it did not wait. /metrics' histogram of waits.
    host_wait = models.DurationField(null=True, blank=True)
    # the last samples of what the job uses on its host, checked and bounded (runs/usage.py)
    usage = models.JSONField(default=list, blank=True)
    # A service's replica this job belongs to, numbered within its replica group (a new submission
    # of the replica keeps the number); 0 for a task's jobs.
    replica_num = models.IntegerField(default=0)
    # The run's deployment_num this job was made for (a rolling update replaces older ones).
    deployment_num = models.IntegerField(default=0)
    # A service's replica: when it was first ready (a replica that was ready once is not ended by
    # its ready_timeout when a probe fails later: it only leaves the pool), and when the engine took
    # it out of the pool to remove it (a rolling update, a scale-down): it is stopped a drain delay later.
    first_ready_at = models.DateTimeField(null=True, blank=True)
    drain_at = models.DateTimeField(null=True, blank=True)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        unique_together = [("run", "submission_num", "job_num")]
        indexes = [models.Index(fields=["status", "waiting_master_job"]),
                   # the jobs waiting for a fleet (few, beside every job)
                   models.Index(fields=["waiting_fleet"], condition=models.Q(waiting_fleet__isnull=False),
                                name="job_waiting_fleet"),
                   # /metrics reads the waits per project: only the jobs that waited, not every job
                   models.Index(fields=["run", "host_wait"], condition=models.Q(host_wait__isnull=False),
                                name="job_host_waits")]
        ordering = ["run_id", "submission_num", "job_num"]

    def __str__(self) -> str:
        return f"{self.run.name}/{self.job_num}"

    @property
    def finished(self) -> bool:
        return self.status in JOB_FINISHED

    @property
    def active(self) -> bool:
        return self.status in JOB_ACTIVE

    @property
    def runner_job_id(self) -> str:
        return str(self.uuid)


class SubmissionKey(models.Model):
    """An Idempotency-Key a client sent with a run submission: a retry with the same key gets the
    same run back instead of a second one. Lives (and goes) with its run."""

    project = models.ForeignKey("projects.Project", on_delete=models.CASCADE, related_name="+")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE,
                             related_name="+")
    key = models.CharField(max_length=255)
    digest = models.CharField(max_length=64)  # HMAC of the request body: the same key with another body is refused
    run = models.OneToOneField(Run, on_delete=models.CASCADE, related_name="submission_key")
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["project", "user", "key"], name="one_run_per_submission_key")]


class AttachGrant(Claimable):
    """One user's attach key line on one job's host (runs/services/attach.py).

    Written (with `install_due`) by the request, before a worker installs the line, and deleted
    only once the line is gone from the host, so a line is never on a host without its row: `revoke_due` rows are the lines still to remove (the
    job ended, the member left, the user lost every token), retried by the sweep until the host
    answers. The job and user may go first; the row keeps what it needs to find the line.
    """

    job = models.ForeignKey(Job, null=True, blank=True, on_delete=models.SET_NULL, related_name="attach_grants")
    instance = models.ForeignKey("instances.Instance", on_delete=models.CASCADE, related_name="attach_grants")
    project = models.ForeignKey("projects.Project", on_delete=models.CASCADE, related_name="attach_grants")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                             related_name="attach_grants")
    marker = models.CharField(max_length=120, blank=True, default="")  # the line's comment (unique per grant)
    revoke_due = models.BooleanField(default=False, db_index=True)
    # what the install step (engine/attach_installs.py) puts on the host: the request writes them,
    # and `install_due` until the line is in; `install_error` is why the last try did not take
    install_due = models.BooleanField(default=False)
    public_key = models.TextField(blank=True, default="")
    ports = models.JSONField(default=list, blank=True)
    # a shell key (`muster ssh`, runs/services/shell.py): its line runs commands in the job's
    # environment instead of forwarding to its ports
    shell = models.BooleanField(default=False)
    install_error = models.CharField(max_length=300, blank=True, default="")
    created = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.marker

    @property
    def needle(self) -> str:
        """What finds this grant's line on its host (backends/ssh/attach_keys.remove)."""
        # " muster-attach-<job>-<grant>-": the dashes around the numbers keep grant 1 from matching 12
        return " " + "-".join(self.marker.split("-")[:4]) + "-"
