"""Plan and submit runs: configuration in, Run and Job rows out (nothing half-created)."""

from __future__ import annotations

import json
import secrets as pysecrets
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction

from events.services import record
from muster import crypto
from muster.api_errors import InvalidInput
from projects.models import Project
from runs.choices import RunStatus
from runs.configuration import (
    ConfigurationError,
    TaskConfiguration,
    expand_jobs,
    load_document,
    parse_run_configuration,
)
from runs.configuration.interpolation import secret_names
from runs.models import Job, Run

MASK = "***"


MAX_RUN_ARGS_CHARS = 64 * 1024


def _payload_parts(payload: Any) -> tuple[Any, dict[str, str], str]:
    if not isinstance(payload, dict):
        raise ConfigurationError([{"loc": [], "msg": "send a JSON object with `configuration` (and optional `env`)"}])
    unknown = sorted(set(payload) - {"configuration", "env", "args"})
    if unknown:
        raise ConfigurationError([{"loc": [k], "msg": f"unknown key `{k}`"} for k in unknown])
    if payload.get("configuration") in (None, ""):
        raise ConfigurationError([{"loc": ["configuration"], "msg": "required: the run configuration (YAML text or an object)"}])
    env = payload.get("env") or {}
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ConfigurationError([{"loc": ["env"], "msg": "must be an object of string values, e.g. {\"HF_TOKEN\": \"...\"}"}])
    args = payload.get("args") or ""
    if not isinstance(args, str) or len(args) > MAX_RUN_ARGS_CHARS:
        raise ConfigurationError([{"loc": ["args"], "msg": (
            f"must be a string of at most {MAX_RUN_ARGS_CHARS} characters: what fills ${{{{ run.args }}}}")}])
    return payload["configuration"], env, args


def _bare_env_keys(doc: dict) -> set[str]:
    """Env keys whose value comes from the request or a secret (never stored in plaintext): bare
    keys, and values that refer to a secret as `${{ secrets.NAME }}`."""

    def bare(env: Any) -> set[str]:
        if isinstance(env, list):
            entries = [e.partition("=") for e in env if isinstance(e, str)]
            return {k.strip() for k, sep, v in entries if not sep or secret_names(v)}
        if isinstance(env, dict):
            return {k for k, v in env.items() if v is None or (isinstance(v, str) and secret_names(v))}
        return set()

    keys = bare(doc.get("env"))
    for group in doc.get("groups") or []:
        if isinstance(group, dict):
            keys |= bare(group.get("env"))
    return keys


def probed_gpu_names(project: Project) -> list[str]:
    """GPU names the project's hosts reported, for names outside the known table."""
    from instances.models import Instance

    names: set[str] = set()
    for resources in Instance.objects.filter(project=project, gpu_count__gt=0).values_list("resources", flat=True):
        for gpu in (resources or {}).get("gpus") or []:
            if isinstance(gpu, dict) and isinstance(gpu.get("name"), str):
                names.add(gpu["name"])
    return sorted(names)


def parse_for_project(project: Project, payload: Any) -> tuple[TaskConfiguration, list, set[str]]:
    data, env_values, run_args = _payload_parts(payload)
    doc = load_document(data)
    if doc.get("type") != "task":
        raise ConfigurationError([{"loc": ["type"], "msg": "a run needs `type: task` (fleets go to /fleets/)"}])
    conf = parse_run_configuration(
        doc, env_values=env_values, secrets=project.lazy_secret_values(), max_nodes=settings.MUSTER["MAX_NODES"],
        run_args=run_args, probed_gpu_names=lambda: probed_gpu_names(project),
    )
    return conf, expand_jobs(conf), _bare_env_keys(doc)


def _masked(job: dict, hidden: set[str]) -> dict:
    env = {k: (MASK if k in hidden else v) for k, v in job["env"].items()}
    return {**job, "env": env}


def _masked_configuration(configuration: dict, hidden: set[str]) -> dict:
    """The configuration as stored and shown: values of bare env keys replaced by a mask."""

    def mask(env: Any) -> Any:
        return {k: (MASK if k in hidden else v) for k, v in env.items()} if isinstance(env, dict) else env

    out = {**configuration, "env": mask(configuration.get("env"))}
    if isinstance(configuration.get("groups"), list):
        out["groups"] = [{**g, "env": mask(g.get("env"))} for g in configuration["groups"]]
    return out


def plan_run(project: Project, payload: Any) -> dict:
    conf, jobs, hidden = parse_for_project(project, payload)
    return {
        "run_name": conf.name or "(generated at submit)",
        "configuration": _masked_configuration(json.loads(conf.model_dump_json()), hidden),
        "jobs": [_masked(j.as_dict(), hidden) for j in jobs],
        # what the configuration asks for that does not take effect here: shown before submitting
        "warnings": conf.warnings,
    }


def _generated_name() -> str:
    return f"run-{pysecrets.token_hex(3)}"


def create_jobs(run: Run, job_specs: list[dict], submission_num: int) -> list[Job]:
    """Job 0 is claimable at once; every other job waits for its master (DESIGN.md section 6)."""
    jobs = [
        Job(
            run=run,
            job_num=spec["job_num"],
            submission_num=submission_num,
            node_group_name=spec["node_group_name"],
            node_group_index=spec["node_group_index"],
            node_group_rank=spec["node_group_rank"],
            waiting_master_job=spec["job_num"] != 0,
            spec=spec,
        )
        for spec in job_specs
    ]
    return Job.objects.bulk_create(jobs)


def submit_run(project: Project, user, payload: Any) -> Run:
    """The new run, with its jobs as `run.submitted_jobs`; raises ConfigurationError or InvalidInput."""
    conf, jobs, hidden = parse_for_project(project, payload)
    specs = [j.as_dict() for j in jobs]
    hidden_values = {}
    for spec in specs:
        popped = sorted(hidden & set(spec["env"]))
        for key in popped:
            hidden_values[key] = spec["env"].pop(key)
        spec["hidden_env"] = popped  # filled from the encrypted store when the job starts
    configuration = _masked_configuration(json.loads(conf.model_dump_json()), hidden)
    stored = {**configuration, "secret_env": crypto.encrypt(json.dumps(hidden_values))}
    # A generated name is not checked first (one statement less per submit): the unique
    # (project, name) constraint catches the rare clash and the whole transaction is tried again.
    clashes = 0
    while True:
        try:
            return _create_run(project, user, conf.name, stored, specs)
        except IntegrityError:
            clashes += 1
            if conf.name or clashes == 5:
                raise


def _create_run(project: Project, user, requested: str | None, configuration: dict, specs: list[dict]) -> Run:
    name = requested or _generated_name()
    with transaction.atomic():
        existing = Run.objects.select_for_update().filter(project=project, name=name).first() if requested else None
        if existing is not None:
            if not existing.finished:
                raise InvalidInput(["name"], f"run {name} is still {existing.status}: stop it first or pick another name")
            existing.delete()
        run = Run.objects.create(
            project=project,
            user=user if user and user.is_authenticated else None,
            name=name,
            configuration=configuration,
            status=RunStatus.SUBMITTED,
        )
        jobs = create_jobs(run, specs, submission_num=0)
        record(project.id, f"run {run.name}", f"submitted with {len(specs)} jobs", status=run.status,
               actor=getattr(user, "username", "") or "api", run_id=run.id)
        from runs import scheduling

        scheduling.on_run_submitted(run, next(j for j in jobs if j.job_num == 0))
    run.submitted_jobs = jobs  # what the API answers with, without reading the rows back
    return run


def secret_env(run: Run) -> dict[str, str]:
    token = run.configuration.get("secret_env", "")
    return json.loads(crypto.decrypt(token)) if token else {}
