"""Every answer of the /dstack layer read by dstack 0.22.5's own client models (in .venv-dstack), as
its CLI reads them: a field the client requires, a wrong type or a value outside its closed enums
fails here, before a CLI command hits it (get_my_user's `creds.token` did, only in attached apply)."""

from __future__ import annotations

import json
import subprocess

import pytest

from instances.models import FleetStatus
from runs.choices import JobStatus, RunStatus
from runs.models import Job, Run
from tests.dstack_cli.bodies import FLEET_SPEC, RUN_SPEC, dstack_client, post, small_fleet
from tests.dstack_cli.helpers import ROOT, dstack_python

pytestmark = [pytest.mark.dstack_cli, pytest.mark.django_db]

CHECK = """
import json, sys
from dstack._internal.core.models.common import CoreModel
from dstack._internal.core.models.fleets import Fleet, FleetPlan
from dstack._internal.core.models.logs import JobSubmissionLogs
from dstack._internal.core.models.projects import Project
from dstack._internal.core.models.runs import Run, RunPlan
from dstack._internal.core.models.users import UserWithCreds
from dstack._internal.core.models.common import validate_extra_ignore
from typing import List
models = {"Project": Project, "UserWithCreds": UserWithCreds, "RunPlan": RunPlan, "Run": Run,
          "Runs": List[Run], "Fleets": List[Fleet], "Fleet": Fleet, "FleetPlan": FleetPlan,
          "JobSubmissionLogs": JobSubmissionLogs}
failed = []
for name, answer in json.load(sys.stdin):
    try:
        validate_extra_ignore(models[name], answer)
    except Exception as exc:
        failed.append(f"{name}: {exc}")
print("\\n".join(failed))
"""


def check_with_dstacks_models(answers: list[tuple[str, object]]) -> str:
    done = subprocess.run([str(dstack_python()), "-c", CHECK], input=json.dumps(answers), capture_output=True,
                          text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_every_answer_the_cli_reads_passes_dstacks_own_models(make_user):
    alice = dstack_client(make_user("alice"))
    fleet = small_fleet()
    answers = [("Project", post(alice, "projects/main/get").json()),
               ("UserWithCreds", post(alice, "users/get_my_user").json()),
               ("RunPlan", post(alice, "project/main/runs/get_plan", {"run_spec": RUN_SPEC}).json()),
               ("FleetPlan", post(alice, "project/main/fleets/get_plan", {"spec": FLEET_SPEC}).json())]
    run = post(alice, "project/main/runs/apply", {"plan": {"run_spec": RUN_SPEC}}).json()
    answers.append(("Run", run))
    # every status a run, a job and a fleet can be in, as the CLI may read them
    row = Run.objects.get(name="hello")
    job = Job.objects.filter(run=row).first()
    job.instance = fleet.instances.first()
    for run_status, job_status in zip(RunStatus.values, JobStatus.values, strict=False):
        Run.objects.filter(pk=row.pk).update(status=run_status)
        Job.objects.filter(pk=job.pk).update(status=job_status, instance=job.instance, end_time=1.5e9)
        answers.append(("Run", post(alice, "project/main/runs/get", {"run_name": "hello"}).json()))
    for status in FleetStatus.values:
        type(fleet).objects.filter(pk=fleet.pk).update(status=status)
        answers.append(("Fleet", post(alice, "project/main/fleets/get", {"name": "small"}).json()))
    answers.append(("Fleets", post(alice, "project/main/fleets/list", {"include_imported": True}).json()))
    answers.append(("Runs", post(alice, "runs/list", {"project_name": "main"}).json()))
    answers.append(("JobSubmissionLogs", post(alice, "project/main/logs/poll", {
        "run_name": "hello", "job_submission_id": run["jobs"][0]["job_submissions"][0]["id"]}).json()))
    assert check_with_dstacks_models(answers) == ""
