"""Plan and submit runs: configuration in, Run and Job rows out (nothing half-created)."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets as pysecrets
from contextlib import nullcontext
from itertools import islice
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.views.decorators.debug import sensitive_variables

from engine import messages
from events.models import Event
from instances import fit_reasons, fitting, queued, spanning
from instances.models import Instance
from muster import crypto
from muster.api_errors import InvalidInput, NotAllowed
from projects.models import Project
from runs import limits as run_limits
from runs import queue
from runs import rows as run_rows
from runs.choices import RunStatus
from runs.configuration import (
    RUN_TYPES,
    ConfigurationError,
    TaskConfiguration,
    group_requirements,
    load_document,
    parse_run_configuration,
    parse_service_configuration,
    stored_specs,
)
from runs.configuration.expansion import expanded_sizes
from runs.configuration.interpolation import secret_names
from runs.job_rows import new_jobs
from runs.models import Run, SubmissionKey
from runs.services import container_policy, group_fleets, local_images, service_runs, submitted_text
from serving.urls_for import endpoint_tls

MASK = "***"


MAX_RUN_ARGS_CHARS = 64 * 1024


def _payload_parts(payload: Any) -> tuple[Any, dict[str, str], str]:
    if not isinstance(payload, dict):
        raise ConfigurationError([{"loc": [], "msg": "send a JSON object with `configuration` (and optional `env`)"}])
    unknown = sorted(set(payload) - {"configuration", "env", "args", "update"})
    if unknown:
        raise ConfigurationError([{"loc": [k], "msg": f"unknown key `{k}`"} for k in unknown])
    if payload.get("configuration") in (None, ""):
        raise ConfigurationError([{"loc": ["configuration"], "msg": "required: the run configuration (YAML text or an object)"}])
    env = payload.get("env") or {}
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ConfigurationError([{"loc": ["env"], "msg": "must be an object of string values, e.g. {\"HF_TOKEN\": \"...\"}"}])
    if not isinstance(payload.get("update", False), bool):
        raise ConfigurationError([{"loc": ["update"], "msg": "must be true or false: true rolls a running service "
                                                            "of the same name to this configuration"}])
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
    names: set[str] = set()
    for resources in Instance.objects.filter(project=project, gpu_count__gt=0).values_list("resources", flat=True):
        for gpu in (resources or {}).get("gpus") or []:
            if isinstance(gpu, dict) and isinstance(gpu.get("name"), str):
                names.add(gpu["name"])
    return sorted(names)


@sensitive_variables()  # the configuration, its env and the project's secrets (muster/debug.py)
def parse_for_project(project: Project, payload: Any) -> tuple[TaskConfiguration, set[str]]:
    """The checked configuration and its bare env keys; the document is read once per request."""
    data, env_values, run_args = _payload_parts(payload)
    doc = load_document(data)
    if doc.get("type") is None:
        raise ConfigurationError([{"loc": ["type"], "msg": "missing `type:`: write `type: task` or `type: service`"}])
    if doc.get("type") not in RUN_TYPES:
        raise ConfigurationError([{"loc": ["type"], "msg": "a run needs `type: task` or `type: service` "
                                                          "(fleets go to /fleets/)"}])
    parse = parse_run_configuration
    kwargs: dict[str, Any] = {}
    if doc["type"] == "service":
        parse, kwargs = parse_service_configuration, {"endpoint_tls": endpoint_tls()}
    conf = parse(
        doc, env_values=env_values, secrets=project.lazy_secret_values(), max_nodes=settings.MUSTER["MAX_NODES"],
        run_args=run_args, probed_gpu_names=lambda: probed_gpu_names(project), **kwargs,
    )
    _check_expanded_size(conf)
    run_limits.check_retry_duration(conf)
    group_fleets.check(project, conf)  # a group's own `fleets:` names fleets of this project
    local_images.check(project, conf)  # `image` where only local fleets could take it: Docker must answer
    container_policy.check(project, conf)  # privileged or host volumes that no candidate fleet allows
    return conf, _bare_env_keys(doc)


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def _check_expanded_size(conf: TaskConfiguration) -> None:
    """Each node's runner is handed its own copy of its group's commands and env: a run whose
    copies add up past MAX_EXPANDED_BYTES is refused before anything is stored."""
    limit = int(settings.MUSTER["MAX_EXPANDED_BYTES"])
    sizes = expanded_sizes(conf)
    total = sum(each * nodes for each, nodes in sizes)
    if total <= limit:
        return
    biggest = max(range(len(sizes)), key=lambda g: sizes[g][0] * sizes[g][1])
    each, nodes = sizes[biggest]
    loc = ["groups", biggest, "nodes"] if conf.uses_groups else ["nodes"]
    raise ConfigurationError([{"loc": loc, "msg": (
        f"the run hands out {_mb(total)} of commands and env over its nodes ({nodes} nodes x {_mb(each)} in "
        f"group {conf.groups[biggest].name}), {_mb(total - limit)} over the limit of {_mb(limit)} "
        "(MUSTER_MAX_EXPANDED_BYTES): use fewer nodes or shorter commands and env")}])


def _masked_configuration(configuration: dict, hidden: set[str]) -> dict:
    """The configuration as stored and shown: values of bare env keys replaced by a mask."""

    def mask(env: Any) -> Any:
        return {k: (MASK if k in hidden else v) for k, v in env.items()} if isinstance(env, dict) else env

    out = {**configuration, "env": mask(configuration.get("env"))}
    if isinstance(configuration.get("groups"), list):
        out["groups"] = [{**g, "env": mask(g.get("env"))} for g in configuration["groups"]]
    return out


PLAN_JOB_KEYS = ("job_num", "node_group_name", "node_group_index", "node_group_rank")


@sensitive_variables()
def plan_run(project: Project, payload: Any, user=None) -> dict:
    """The plan: every job by its place in the run; what it runs (commands, env, resources, image,
    ports) is its group's, stated once in `configuration.groups[node_group_index]`, so the answer
    does not grow with nodes x commands. Built from the groups: no job rows, no per-job specs."""
    conf, hidden = parse_for_project(project, payload)
    groups = group_requirements(conf)
    dumped = json.loads(conf.model_dump_json())
    jobs = [{k: spec[k] for k in (*PLAN_JOB_KEYS, "replica_num") if k in spec} for spec in stored_specs(conf)]
    replicas = service_runs.plan_replicas(conf)
    if replicas is not None:
        # the hosts a service needs now: `nodes` per replica it starts with (at least one replica, to
        # show where it goes)
        groups = [(name, index, req, max(replicas[name]["desired"], 1) * nodes) for name, index, req, nodes in groups]
    capacity = plan_capacity(project, conf.fleets or [], [(name, req, n) for name, _, req, n in groups], dumped, user)
    return {
        **({"replicas": replicas, "service_url": service_runs.planned_url(project, conf)} if replicas else {}),
        "run_name": conf.name or "(generated at submit)",
        "configuration": _masked_configuration(dumped, hidden),
        "jobs": jobs,
        "capacity": capacity,
        # what the configuration asks for that does not take effect here (or on the fleet it would go to)
        "warnings": [*conf.warnings,
                     *queued.whole_set_warnings(project.pk, dumped.get("groups") or [], capacity.get("fleets") or {})],
        "replaces": replaced_run(project, conf.name),
        **({"updates": service_runs.updated_service(project, conf)} if replicas is not None else {}),
    }


def replaced_run(project: Project, name: str | None) -> dict | None:
    """The finished run a submit under `name` replaces (as dstack replaces it), said before it is:
    its jobs, logs and events go with it. None when the name is free (or held by a live run, which
    the submit refuses)."""
    if not name:
        return None
    old = Run.objects.filter(project=project, name=name).only("status", "submitted_at", "finished_at").first()
    if old is None or not old.finished:
        return None
    return {"name": name, "status": old.status, "submitted_at": old.submitted_at.isoformat(),
            "message": f"run {name} exists and has ended ({old.status}): submitting replaces it, as dstack "
                       "does; its jobs, logs and events are deleted (pick another name to keep it)"}


def plan_capacity(project: Project, wanted: list[str], groups: list[tuple[str, dict, int]],
                  configuration: dict | None = None, user=None) -> dict:
    """Where `user`'s run would go now, or why it fits nowhere now (the same test placement makes).

    Two statements when it fits (the fleets, then one page of idle hosts per group): the hosts the
    plan names are those the fit test read, not read again."""
    local = fitting.local_allowed(user)
    usable = fitting.fleets_for(project.pk, wanted, local=local, backends=fitting.run_backends(configuration))
    fleets = fitting.allowing_fleets(usable, configuration) if configuration is not None else usable
    pools: list[list] = []
    chosen = spanning.assign(fleets, spanning.group_fleet_names(configuration or {}),
                             [(req, n) for _, req, n in groups], pools=pools, at_least=shown_hosts)
    if chosen is not None:
        # groups on a flex-start fleet: how long after it is given their slice is reclaimed
        deadlines = queued.flex_start_deadlines([name for name, _, _ in groups], chosen)
        # `fleet`: group 0's (the whole run's unless it spans fleets); `fleets`: each group's
        return {"fits": True, "fleet": chosen[0].name, "reasons": [],
                "fleets": {name: f.name for (name, _, _), f in zip(groups, chosen, strict=True)},
                "hosts": fitting_hosts(chosen, groups, pools), **({"deadlines": deadlines} if deadlines else {})}
    answer = {"fits": False, "fleet": None,
              "reasons": fit_reasons.explain(project.pk, wanted, groups, configuration, local=local, fleets=usable)}
    if configuration is not None and spanning.waits_on_full_fleet(configuration):
        # submitted now, the run would wait for hosts of these fleets instead of failing (engine/submitted/waiting.py)
        full = spanning.assign(fleets, spanning.group_fleet_names(configuration), [(req, n) for _, req, n in groups],
                               busy_too=True)
        if full:
            answer["waits_for"] = f"a free host: {spanning.full_fleets(full)}"
            # where it would stand among the project's waiting runs (runs/queue.py)
            answer["queue_position"] = queue.place_for_new(project.pk, queue.priority_of(configuration))
    return answer


def check_local_fleets(project: Project, user, wanted: list[str]) -> None:
    """A run that only local fleets could take, from someone whose runs may not go there, is a 403
    now rather than a run that can never be placed."""
    if fitting.local_allowed(user) or fitting.fleets_for(project.pk, wanted, local=False):
        return
    if fitting.fleets_for(project.pk, wanted):
        raise NotAllowed(["fleets"], fitting.LOCAL_REFUSED)


# `hosts` of a plan names at most this many hosts per group: a summary, not an inventory
PLAN_HOSTS_PER_GROUP = 32


def shown_hosts(nodes: int) -> int:
    return min(max(nodes, 8), PLAN_HOSTS_PER_GROUP)


def fitting_hosts(fleets: list, groups, pools: list[list]) -> dict[str, list[str]]:
    """Each group's idle hosts that fit it now on its fleet (a host may fit several groups), from
    the pools the fit test read when one fleet holds the run; an empty list for a group on a fleet
    that makes its hosts for the run."""
    def shown(g: int, fleet, req: dict, n: int) -> list[str]:
        if not fitting.is_static(fleet):
            return []
        found = pools[g] if pools else fitting.candidates(fleet, req)
        return [i.name for i in islice(found, shown_hosts(n))]

    return {name: shown(g, fleet, req, n)
            for g, ((name, req, n), fleet) in enumerate(zip(groups, fleets, strict=True))}


def _generated_name() -> str:
    return f"run-{pysecrets.token_hex(3)}"


IDEMPOTENCY_KEY = re.compile(r"[\x21-\x7e]{1,255}")


def idempotency_key_of(headers) -> str | None:
    """The request's `Idempotency-Key` header (None without one); a malformed one is a 400 on it."""
    key = headers.get("Idempotency-Key")
    if key is not None and not IDEMPOTENCY_KEY.fullmatch(key):
        raise InvalidInput(["headers", "Idempotency-Key"], "1 to 255 printable ASCII characters (e.g. a UUID)")
    return key


@sensitive_variables()
def _request_digest(payload: Any) -> str:
    # keyed: the body may carry secret env values, and a plain hash of a short one can be guessed
    body = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hmac.new(settings.SECRET_KEY.encode(), b"muster-idempotency:" + body, hashlib.sha256).hexdigest()


def _replayed(project: Project, user, key: str, digest: str) -> Run | None:
    """The run an earlier submission with this Idempotency-Key made, or None; a different body is an error."""
    owner = user if user is not None and user.is_authenticated else None
    found = SubmissionKey.objects.select_related("run").filter(project=project, user=owner, key=key).first()
    if found is None:
        return None
    if not hmac.compare_digest(found.digest, digest):
        raise InvalidInput(["headers", "Idempotency-Key"], f"this key was already used for another request (run "
                                                          f"{found.run.name}): use a new key for a new submission")
    found.run.replayed = True
    return found.run


@sensitive_variables()
def submit_run(project: Project, user, payload: Any, idempotency_key: str | None = None) -> Run:
    """The new run, with its jobs as `run.submitted_jobs`; raises ConfigurationError or InvalidInput.

    With an idempotency key already used by this caller in this project, the run that submission
    made (`run.replayed` set) instead of a new one: a client that lost the first answer retries safely.
    """
    digest = _request_digest(payload) if idempotency_key else ""
    if idempotency_key:
        replay = _replayed(project, user, idempotency_key, digest)
        if replay is not None:
            return replay
    conf, hidden = parse_for_project(project, payload)
    check_local_fleets(project, user, conf.fleets or [])
    data, env_values, _ = _payload_parts(payload)
    update = payload.get("update") is True
    text = submitted_text.submitted(data, hidden, env_values)
    # A job row keeps its place and resources; its commands and env are its group's, kept once in
    # the stored configuration (engine/starting/cluster.py puts them together when the job starts).
    specs = stored_specs(conf)
    hidden_values = {key: group.env[key] for group in conf.groups for key in hidden & set(group.env)}
    configuration = _masked_configuration(json.loads(conf.model_dump_json()), hidden)
    # the masked keys, filled from the encrypted store when a job starts
    stored = {**configuration, "secret_env": crypto.encrypt(json.dumps(hidden_values)),
              "hidden_env": sorted(hidden_values)}
    if conf.registry_password:  # used for the image pull only (engine/starting/cluster.py), encrypted at rest
        stored["secret_registry_password"] = crypto.encrypt(conf.registry_password)
    if update and conf.name:
        updated = service_runs.update(project, user, conf, stored, text)
        if updated is not None:
            return updated
    run_limits.check_project_caps(project, configuration)
    # A generated name is not checked first (one statement less per submit): the unique
    # (project, name) constraint catches the rare clash and the whole transaction is tried again.
    clashes = 0
    while True:
        try:
            return _create_run(project, user, conf.name, stored, specs, (idempotency_key, digest), text)
        except IntegrityError:
            # the same key sent twice at once: the other request made the run
            replay = _replayed(project, user, idempotency_key, digest) if idempotency_key else None
            if replay is not None:
                return replay
            if conf.name:
                raise InvalidInput(["name"], f"run {conf.name} was just submitted by another request: "
                                             "pick another name, or stop that run first") from None
            clashes += 1
            if clashes == 5:
                raise


@sensitive_variables()
def _create_run(project: Project, user, requested: str | None, configuration: dict, specs: list[dict],
                idempotency: tuple[str | None, str] = (None, ""), text: str = "") -> Run:
    name = requested or _generated_name()
    run = Run(project=project, user=user if user and user.is_authenticated else None, name=name,
              configuration=configuration, submitted_text=text, status=RunStatus.SUBMITTED,
              priority=queue.priority_of(configuration), desired_replicas=service_runs.desired_at_submit(configuration))
    jobs = new_jobs(run, specs, submission_num=0)
    event = Event(project_id=project.id, subject=f"run {name}", message=service_runs.submitted_message(run, specs),
                  status=run.status, actor=getattr(user, "username", "") or "api")
    # The usual submit (a generated name, no key) is one statement on PostgreSQL (runs/rows.py),
    # atomic by itself. A name to check, a key to keep, SQLite, a very large run, or a caller's transaction (whose
    # savepoint lets the clash retry below go on) take a transaction of their own.
    alone = (not requested and not idempotency[0] and run_rows.one_statement(connection, len(jobs))
             and not connection.in_atomic_block)
    with nullcontext() if alone else transaction.atomic():
        existing = Run.objects.select_for_update().filter(project=project, name=name).first() if requested else None
        if existing is not None:
            if not existing.finished:
                raise InvalidInput(["name"], f"run {name} is still {existing.status}: stop it first or pick another "
                                             f"name{service_runs.update_hint(existing, configuration)}")
            # said in the new run's history: the old one's goes with it
            event.message += (f", replacing the run of this name that had ended ({existing.status}, submitted "
                              f"{existing.submitted_at:%Y-%m-%d %H:%M:%S} UTC): its jobs, logs and events were deleted")
            existing.delete()
        run_rows.insert(run, jobs, event)
        if idempotency[0]:
            SubmissionKey.objects.create(project=project, user=run.user, key=idempotency[0], digest=idempotency[1],
                                         run=run)
        # job 0 is claimable at once; the others wait for their master (runs/job_rows.py); a
        # service's replicas are each claimable at once by their node 0 (none at all when it starts at 0
        # replicas)
        for job in [j for j in jobs if not j.waiting_master_job]:
            messages.provision_job(job.pk)
        if not jobs:
            messages.process_run(run.pk)
    run.submitted_jobs = jobs  # what the API answers with, without reading the rows back
    return run
