"""The gang let go: a run whose cloud group (a TPU slice) cannot be had gives back, in the same
step, the static hosts its other groups hold while the slice is being made.

Job 0 takes the static hosts of every group at once (provision._take_gang); a slice is created
after that and may take minutes, or never come. The static jobs wait on their hosts for the
slice's addresses meanwhile, so none of them has been handed to its runner: they end here at once
(`terminated_by_server`), their hosts go back idle in the same transaction, and the run says why
("gang released: <group>: <why>"). The failing slice job fails the run as before, so `retry:
no-capacity` tries the whole run again later.
"""

from __future__ import annotations

from django.db import transaction

from engine.submitted.waiting import hand_back
from events.services import record
from instances.models import GroupKind
from runs.choices import JobReason, JobStatus
from runs.models import Job, Run
from runs.transitions import move_job, terminate_job

# a static job still waiting for its peers: nothing of it runs on its host yet
_HOLDING = (JobStatus.SUBMITTED, JobStatus.PROVISIONING, JobStatus.PULLING)


def release(run: Run, submission_num: int, group_name: str, why: str) -> int:
    """End the run's jobs that hold static hosts and give the hosts back; returns how many hosts."""
    text = f"gang released: {group_name}: {why}"
    handed = 0
    with transaction.atomic():
        holders = (Job.objects.filter(run_id=run.pk, submission_num=submission_num, status__in=_HOLDING,
                                      instance__isnull=False)
                   .exclude(instance__group__kind=GroupKind.TPU_POD)
                   .select_related("run", "instance").order_by("job_num"))
        for job in holders:
            if job.runner_submitted:  # handed to its runner after all: stopped the usual way
                terminate_job(job, JobReason.TERMINATED_BY_SERVER, text)
                continue
            if move_job(job, JobStatus.TERMINATED, frm=_HOLDING, termination_reason=JobReason.TERMINATED_BY_SERVER,
                        termination_message=text, message=text):
                handed += len(hand_back([job.instance], job, f"given back by job {job.run.name}/{job.job_num}: "
                                                              f"{text}"))
        if handed:
            record(run.project_id, f"run {run.name}", f"{text} ({handed} static host{'s' if handed != 1 else ''} "
                   "given back)", status=run.status, run_id=run.pk)
    return handed
