"""Status and termination-reason enums of runs and jobs (docs/how-it-works.md, "Statuses and reasons")."""

from __future__ import annotations

from django.db import models

from runner import protocol


class RunStatus(models.TextChoices):
    PENDING = "pending"
    SUBMITTED = "submitted"
    PROVISIONING = "provisioning"
    RUNNING = "running"
    TERMINATING = "terminating"
    TERMINATED = "terminated"
    FAILED = "failed"
    DONE = "done"


RUN_FINISHED = (RunStatus.TERMINATED, RunStatus.FAILED, RunStatus.DONE)
# how job 0's `waiting_for` starts while its run waits for a host of a full fleet (engine/submitted/waiting.py)
WAITING_FOR_HOST = "a free host"


class JobStatus(models.TextChoices):
    SUBMITTED = "submitted"
    PROVISIONING = "provisioning"
    PULLING = "pulling"
    RUNNING = "running"
    TERMINATING = "terminating"
    TERMINATED = "terminated"
    ABORTED = "aborted"
    FAILED = "failed"
    DONE = "done"


class RunnerState(models.TextChoices):
    """A job's state as its runner reports it: the words of runner/protocol.py, which the runner
    writes into each job's status.json (tests/test_vocabulary.py holds the two together)."""

    SUBMITTED = protocol.SUBMITTED
    STARTING = protocol.STARTING
    PULLING = protocol.PULLING  # a job with an image: its runner is pulling the image (engine/starting/containers.py)
    RUNNING = protocol.RUNNING
    DONE = protocol.DONE
    FAILED = protocol.FAILED
    TERMINATED = protocol.TERMINATED
    MAX_DURATION_EXCEEDED = protocol.MAX_DURATION_EXCEEDED


RUNNER_LIVE = (RunnerState.RUNNING, RunnerState.PULLING, RunnerState.STARTING, RunnerState.SUBMITTED)  # its processes may be alive
RUNNER_FINAL = (RunnerState.DONE, RunnerState.FAILED, RunnerState.TERMINATED, RunnerState.MAX_DURATION_EXCEEDED)


class StopRequest(models.TextChoices):
    """Run.stop_requested: empty until a user asks."""

    STOP = "stop"
    ABORT = "abort"


JOB_FINISHED = (JobStatus.TERMINATED, JobStatus.ABORTED, JobStatus.FAILED, JobStatus.DONE)
JOB_ACTIVE = (JobStatus.SUBMITTED, JobStatus.PROVISIONING, JobStatus.PULLING, JobStatus.RUNNING)
JOB_UNFINISHED = (*JOB_ACTIVE, JobStatus.TERMINATING)  # not ended: active, or being stopped
# placed and not ended: the jobs the instance list shows on their hosts (a submitted job may point
# at a host it has reserved, but holds it only once provisioning)
JOB_ON_HOST = (JobStatus.PROVISIONING, JobStatus.PULLING, JobStatus.RUNNING, JobStatus.TERMINATING)
# a job whose ports `muster attach` may reach: its process is on its host (runs/services/attach.py,
# engine/attach_installs.py)
JOB_ATTACHABLE = (JobStatus.PULLING, JobStatus.RUNNING)


class JobReason(models.TextChoices):
    FAILED_TO_START_DUE_TO_NO_CAPACITY = "failed_to_start_due_to_no_capacity"
    INTERRUPTED_BY_NO_CAPACITY = "interrupted_by_no_capacity"
    INSTANCE_UNREACHABLE = "instance_unreachable"
    WAITING_INSTANCE_LIMIT_EXCEEDED = "waiting_instance_limit_exceeded"
    WAITING_RUNNER_LIMIT_EXCEEDED = "waiting_runner_limit_exceeded"
    WAITING_PEERS_LIMIT_EXCEEDED = "waiting_peers_limit_exceeded"
    # running, but its probes did not all pass within the group's `ready_timeout`
    WAITING_READY_LIMIT_EXCEEDED = "waiting_ready_limit_exceeded"
    TERMINATED_BY_USER = "terminated_by_user"
    ABORTED_BY_USER = "aborted_by_user"
    TERMINATED_BY_SERVER = "terminated_by_server"
    DONE_BY_RUNNER = "done_by_runner"
    # a worker stopped because its master finished under `stop_criteria: master-done` (dstack says
    # done_by_runner here, which claims the worker's own commands finished)
    MASTER_DONE = "master_done"
    CONTAINER_EXITED_WITH_ERROR = "container_exited_with_error"
    # a job without an image: its commands ran as host processes, there was no container
    PROCESS_EXITED_WITH_ERROR = "process_exited_with_error"
    CREATING_CONTAINER_ERROR = "creating_container_error"
    EXECUTOR_ERROR = "executor_error"
    MAX_DURATION_EXCEEDED = "max_duration_exceeded"
    # Muster's (dstack has no preemption): a preemptible run stopped, with its grace, to free hosts for
    # a waiting run of a higher priority (engine/submitted/preemption.py); an interruption to `retry`
    PREEMPTED = "preempted"


class RunReason(models.TextChoices):
    ALL_JOBS_DONE = "all_jobs_done"
    MASTER_JOB_DONE = "master_job_done"  # stop_criteria: master-done, and job 0 finished
    JOB_FAILED = "job_failed"
    RETRY_LIMIT_EXCEEDED = "retry_limit_exceeded"
    STOPPED_BY_USER = "stopped_by_user"
    ABORTED_BY_USER = "aborted_by_user"
    SERVER_ERROR = "server_error"


# Reasons that fail a run (or make it retry); user stops and runner completions do not.
FAILING_REASONS = frozenset({
    JobReason.FAILED_TO_START_DUE_TO_NO_CAPACITY, JobReason.INTERRUPTED_BY_NO_CAPACITY,
    JobReason.INSTANCE_UNREACHABLE, JobReason.WAITING_INSTANCE_LIMIT_EXCEEDED,
    JobReason.WAITING_RUNNER_LIMIT_EXCEEDED, JobReason.WAITING_PEERS_LIMIT_EXCEEDED,
    JobReason.WAITING_READY_LIMIT_EXCEEDED,
    JobReason.CONTAINER_EXITED_WITH_ERROR, JobReason.PROCESS_EXITED_WITH_ERROR, JobReason.EXECUTOR_ERROR,
    JobReason.MAX_DURATION_EXCEEDED,
    JobReason.CREATING_CONTAINER_ERROR, JobReason.PREEMPTED,
})

# Which retry event (if any) a job termination reason counts as.
RETRY_EVENT = {
    JobReason.FAILED_TO_START_DUE_TO_NO_CAPACITY: "no-capacity",
    JobReason.INTERRUPTED_BY_NO_CAPACITY: "interruption",
    JobReason.INSTANCE_UNREACHABLE: "interruption",
    JobReason.PREEMPTED: "interruption",
    JobReason.WAITING_INSTANCE_LIMIT_EXCEEDED: "no-capacity",
    JobReason.WAITING_RUNNER_LIMIT_EXCEEDED: "error",
    JobReason.WAITING_PEERS_LIMIT_EXCEEDED: "error",
    JobReason.WAITING_READY_LIMIT_EXCEEDED: "error",
    JobReason.CONTAINER_EXITED_WITH_ERROR: "error",
    JobReason.PROCESS_EXITED_WITH_ERROR: "error",
    JobReason.CREATING_CONTAINER_ERROR: "error",
    JobReason.EXECUTOR_ERROR: "error",
    JobReason.MAX_DURATION_EXCEEDED: None,
    JobReason.TERMINATED_BY_USER: None,
    JobReason.ABORTED_BY_USER: None,
    JobReason.TERMINATED_BY_SERVER: None,
    JobReason.DONE_BY_RUNNER: None,
    JobReason.MASTER_DONE: None,
}

# The status a job ends in for each reason.
FINAL_STATUS = {
    JobReason.FAILED_TO_START_DUE_TO_NO_CAPACITY: JobStatus.FAILED,
    JobReason.INTERRUPTED_BY_NO_CAPACITY: JobStatus.FAILED,
    JobReason.INSTANCE_UNREACHABLE: JobStatus.FAILED,
    JobReason.PREEMPTED: JobStatus.FAILED,
    JobReason.WAITING_INSTANCE_LIMIT_EXCEEDED: JobStatus.FAILED,
    JobReason.WAITING_RUNNER_LIMIT_EXCEEDED: JobStatus.FAILED,
    JobReason.WAITING_PEERS_LIMIT_EXCEEDED: JobStatus.FAILED,
    JobReason.WAITING_READY_LIMIT_EXCEEDED: JobStatus.FAILED,
    JobReason.CONTAINER_EXITED_WITH_ERROR: JobStatus.FAILED,
    JobReason.PROCESS_EXITED_WITH_ERROR: JobStatus.FAILED,
    JobReason.CREATING_CONTAINER_ERROR: JobStatus.FAILED,
    JobReason.EXECUTOR_ERROR: JobStatus.FAILED,
    JobReason.MAX_DURATION_EXCEEDED: JobStatus.TERMINATED,
    JobReason.TERMINATED_BY_USER: JobStatus.TERMINATED,
    JobReason.ABORTED_BY_USER: JobStatus.ABORTED,
    JobReason.TERMINATED_BY_SERVER: JobStatus.TERMINATED,
    JobReason.DONE_BY_RUNNER: JobStatus.DONE,
    JobReason.MASTER_DONE: JobStatus.DONE,
}
