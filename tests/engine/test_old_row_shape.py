"""Runs stored when each job row held its group's commands (runs/migrations/0013): rewritten once
into the current shape, after which their jobs start with the same commands, env and image."""

from __future__ import annotations

import copy
import importlib

import pytest
from django.apps import apps

from engine.starting.cluster import group_commands_and_env, group_image
from runs.models import Job, Run
from runs.services.submission import submit_run

migration = importlib.import_module("runs.migrations.0013_group_commands_in_configuration")

TWO_GROUPS = """
type: task
name: veteran
env: [HF_TOKEN, MODEL=llama]
groups:
  - name: head
    image: ubuntu:24.04
    ports: [8000]
    commands: [serve --token $HF_TOKEN]
  - name: work
    nodes: 2
    commands: ["work ${{ groups[0].nodes[0].IP_ADDRESS }}", echo $MODEL]
"""


def to_old_shape(run: Run) -> None:
    """The rows as the release before 80be619 wrote them: each job's spec with its group's commands,
    env without the masked keys (named in its `hidden_env`), image and ports; no `hidden_env` in
    the run's configuration."""
    conf = copy.deepcopy(run.configuration)
    hidden = conf.pop("hidden_env")
    for job in Job.objects.filter(run=run):
        group = conf["groups"][job.node_group_index]
        job.spec = {**job.spec, "commands": group["commands"], "image": group["image"], "ports": group["ports"],
                    "env": {k: v for k, v in group["env"].items() if k not in hidden},
                    "hidden_env": sorted(set(hidden) & set(group["env"]))}
        job.save(update_fields=["spec"])
    for group in conf["groups"]:
        group["commands"] = ["written before the jobs' copies were dropped"]
    Run.objects.filter(pk=run.pk).update(configuration=conf)


def started_with(run: Run) -> list:
    jobs = list(Run.objects.get(pk=run.pk).current_jobs())
    return [(group_commands_and_env(j), group_image(j)) for j in jobs]


@pytest.mark.django_db
def test_an_old_run_is_rewritten_once_into_the_current_shape_and_starts_the_same(project):
    run = submit_run(project, None, {"configuration": TWO_GROUPS, "env": {"HF_TOKEN": "hf_secret"}})
    current = Run.objects.get(pk=run.pk)
    specs = {j.pk: j.spec for j in Job.objects.filter(run=run)}
    before = started_with(run)
    assert before[0] == ((["serve --token $HF_TOKEN"], {"HF_TOKEN": "hf_secret", "MODEL": "llama"}), "ubuntu:24.04")

    to_old_shape(run)
    assert all("commands" in j.spec for j in Job.objects.filter(run=run))
    migration.current_shape(apps, None)

    assert Run.objects.get(pk=run.pk).configuration == current.configuration, "the shape a submit writes now"
    assert {j.pk: j.spec for j in Job.objects.filter(run=run)} == specs
    assert started_with(run) == before
    untouched = Run.objects.get(pk=run.pk).updated
    migration.current_shape(apps, None)  # a second run of it finds nothing to do
    assert Run.objects.get(pk=run.pk).updated == untouched


@pytest.mark.django_db
def test_rows_of_the_current_shape_are_left_alone(project):
    run = submit_run(project, None, {"configuration": TWO_GROUPS, "env": {"HF_TOKEN": "hf_secret"}})
    stored = Run.objects.get(pk=run.pk).configuration
    migration.current_shape(apps, None)
    assert Run.objects.get(pk=run.pk).configuration == stored
