"""What a run's jobs are made of, for the submit (runs/services/submission.py) and for a retry
(engine/processing.py): the job rows, and the secret env they start with (sealed at submit)."""

from __future__ import annotations

import json

from django.views.decorators.debug import sensitive_variables

from muster import crypto
from runs.configuration.stored import run_configuration
from runs.models import Job, Run


def create_jobs(run: Run, job_specs: list[dict], submission_num: int) -> list[Job]:
    return Job.objects.bulk_create(new_jobs(run, job_specs, submission_num))


def new_jobs(run: Run, job_specs: list[dict], submission_num: int) -> list[Job]:
    """The job rows, not written yet. Job 0 is claimable at once; every other job waits for its
    master (docs/how-it-works.md, step 3). A service's replicas are placed each on its own: every
    replica's node 0 is claimable at once and places its replica's other nodes with it (a
    multi-host replica, `nodes: N`); each job is made for the run's current deployment."""
    service = run_configuration(run).type == "service"
    return [
        Job(
            run=run,
            job_num=spec["job_num"],
            submission_num=submission_num,
            node_group_name=spec["node_group_name"],
            node_group_index=spec["node_group_index"],
            node_group_rank=spec["node_group_rank"],
            waiting_master_job=spec["node_group_rank"] != 0 if service else spec["job_num"] != 0,
            replica_num=spec.get("replica_num", 0),
            deployment_num=run.deployment_num,
            spec=spec,
        )
        for spec in job_specs
    ]


@sensitive_variables()
def secret_env(run: Run) -> dict[str, str]:
    token = run_configuration(run).server.secret_env
    if not token:
        return {}
    return json.loads(crypto.decrypt(token, loc=["runs", run.name, "env"], what=f"the secret env of run {run.name}",
                                     fix="submit the run again"))
