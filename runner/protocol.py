"""The contract between the server and the runner: the job states, the verbs, the spec the server
sends and the status document the runner prints.

The server imports this module (runs.choices.RunnerState, engine.starting.cluster.runner_spec,
engine.runner_status.checked) and the runner ships it to every host inside its zipapp, so it must
stay standard-library only and run on Python 3.8+ (tests/runner/test_runner_package.py).
"""

from __future__ import annotations

from typing import Any

VERSION = "1"

# A job's states in its status.json, written by the runner, read by the server as RunnerState.
SUBMITTED = "submitted"  # the spec is stored, no runner has taken it yet
STARTING = "starting"  # the agent is spawning its job runner
PULLING = "pulling"  # a container job: the image is being pulled
RUNNING = "running"
DONE = "done"
FAILED = "failed"
TERMINATED = "terminated"  # stopped on request
MAX_DURATION_EXCEEDED = "max_duration_exceeded"
LIVE_STATES = (SUBMITTED, STARTING, PULLING, RUNNING)  # its processes may be alive
FINAL_STATES = (DONE, FAILED, TERMINATED, MAX_DURATION_EXCEEDED)
STATES = LIVE_STATES + FINAL_STATES
MAX_PROBE_RESULTS = 64  # more than a spec may hold (runs/configuration/readiness.py MAX_PROBES)

# The verbs of the runner's CLI: verb -> (needs --job, help). runner/cli.py maps each to its
# handler and its own arguments; a new verb is one entry here and one there.
COMMANDS = {
    "agent": (False, "long-lived loop that starts submitted jobs"),
    "ensure-agent": (False, "start the agent unless one is alive; prints {started, pid}"),
    "submit": (True, "store the spec read from stdin unless the job exists; prints {submitted}"),
    "status": (False, "print the agent and every job's status as one JSON document"),
    "stop": (True, "ask a job to stop; prints {stopping}"),
    "log": (True, "write raw bytes of a job's output.log to stdout"),
    "cleanup": (True, "remove a job's directory unless it is running; prints {removed}"),
    "job": (True, "internal: run one job (spawned by the agent)"),
    "forward": (False, "internal: an attach key's forced command, stdin/stdout to --to:$SSH_ORIGINAL_COMMAND"),
    "shell": (True, "internal: a shell key's forced command, $SSH_ORIGINAL_COMMAND or a shell in the job's env"),
}

# The spec ``submit`` reads from stdin (all optional but ``commands``):
SPEC_FIELDS = (
    "job_id",  # the job's id on its host (Job.uuid); also the job directory's name
    "run_name", "job_num", "nodes_num",  # DSTACK_RUN_NAME, DSTACK_JOB_NUM (and DSTACK_NODE_RANK), DSTACK_NODES_NUM
    "node_rank",  # DSTACK_NODE_RANK when not job_num: the node within a service's multi-host replica
    "node_group_name", "node_group_index", "node_group_rank",  # DSTACK_NODE_GROUP_*
    "commands",  # shell lines, run under `set -e`
    "env",  # the user's env, applied last; values are dropped from disk once the job starts
    "max_duration",  # seconds, or None: the job then ends as max_duration_exceeded
    "stop_grace",  # seconds between SIGTERM and SIGKILL (default 5)
    "node_ip",  # this node's address (DSTACK_NODE_IP)
    "gpus",  # GPUs this node counts as its own (DSTACK_GPUS_PER_NODE)
    "cluster_info",  # {job_ips, master_job_ip, gpus_per_node}: every node in rank order
    "tpu",  # None, or {worker_id, worker_hostnames}: TPU_WORKER_ID, TPU_WORKER_HOSTNAMES, and for a
    # multislice set {num_slices, slice_id, coordinator_address, megascale_port}: MEGASCALE_*
    "container",  # None (commands on the host), or CONTAINER_FIELDS
    "cgroup",  # false keeps the job out of cgroups (the marker alone then stops it)
    "probes",  # readiness probes, run by the job runner once the job runs (runner/probes.py); None: none
    "log_limit",  # bytes of output.log kept on the host, the last a line that says so (runner/output_log.py)
)
CONTAINER_FIELDS = (
    "image", "privileged", "user", "entrypoint", "working_dir", "shell", "volumes", "shm_size",
    "gpus",  # "nvidia", "amd" or None
    "pull_timeout",  # seconds
    "registry_auth",  # None or {username, password}; the password is dropped from disk at start
    "policy",  # the fleet's {allow_privileged, allowed_prefixes}, enforced again on the host
)


def job_spec(**fields: Any) -> dict[str, Any]:
    """A spec from its fields; a field the runner does not know is a programming error."""
    unknown = sorted(set(fields) - set(SPEC_FIELDS))
    container = fields.get("container")
    if isinstance(container, dict):
        unknown += sorted("container." + key for key in set(container) - set(CONTAINER_FIELDS))
    if unknown:
        raise TypeError(f"fields the runner does not read: {', '.join(unknown)}")
    return dict(fields)


def validate_spec(spec: Any) -> dict[str, Any]:
    """The spec if it can be run; raises ValueError naming what is wrong."""
    if not isinstance(spec, dict):
        raise ValueError("spec must be a JSON object")
    commands = spec.get("commands")
    if not isinstance(commands, list) or not all(isinstance(c, str) for c in commands):
        raise ValueError("spec.commands must be a list of strings")
    if spec.get("env") is not None and not isinstance(spec.get("env"), dict):
        raise ValueError("spec.env must be an object")
    limit = spec.get("log_limit")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0):
        raise ValueError("spec.log_limit must be a positive whole number of bytes or null")
    for key in ("max_duration", "stop_grace"):
        value = spec.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ValueError(f"spec.{key} must be a number or null")
    problem = probe_problem(spec.get("probes"))
    if problem is not None:
        raise ValueError(problem)
    container = spec.get("container")
    if container is not None:
        if not isinstance(container, dict) or not isinstance(container.get("image"), str) or not container["image"]:
            raise ValueError("spec.container must be an object with an image")
        volumes = container.get("volumes") or []
        if not isinstance(volumes, list) or not all(isinstance(v, str) for v in volumes):
            raise ValueError("spec.container.volumes must be a list of strings")
        policy = container.get("policy")
        if policy is not None and (not isinstance(policy, dict) or not isinstance(policy.get("allowed_prefixes", []), list)):
            raise ValueError("spec.container.policy must be an object with allowed_prefixes a list")
    return spec

def probe_problem(probes: Any) -> str | None:
    """What is wrong with a spec's probes (None when the runner can run them)."""
    if probes is None:
        return None
    if not isinstance(probes, list):
        return "spec.probes must be a list"
    for i, probe in enumerate(probes):
        if not isinstance(probe, dict) or probe.get("type") not in ("http", "tcp", "exec"):
            return f"spec.probes[{i}] must be an object with type http, tcp or exec"
        if probe["type"] == "exec":
            command = probe.get("command")
            if not isinstance(command, list) or not command or not all(isinstance(c, str) for c in command):
                return f"spec.probes[{i}].command must be a non-empty list of strings"
        elif isinstance(probe.get("port"), bool) or not isinstance(probe.get("port"), int):
            return f"spec.probes[{i}].port must be a number"
        for key in ("interval", "timeout"):
            value = probe.get(key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                return f"spec.probes[{i}].{key} must be a positive number"
    return None


# The fields of a job's status the server reads (runner/commands.py status_report), each checked.
_NUMBER = (int, float)
_TIMES = ("start_time", "end_time", "time")


def status_problem(doc: Any) -> str | None:
    """What is wrong with a status document (None when it has the shape ``status`` prints).

    It comes from a host the server does not control (a broken runner, a full disk, someone else's
    program on the path). ``"jobs": null`` is read as no jobs and replaced in ``doc``."""
    if not isinstance(doc, dict):
        return f"the runner's status is not an object: {_short(doc)}"
    if not isinstance(doc.get("agent_alive", False), bool):
        return f"the runner's agent_alive is not true or false: {_short(doc.get('agent_alive'))}"
    jobs = doc.get("jobs", {})
    if jobs is None:
        jobs = doc["jobs"] = {}
    if not isinstance(jobs, dict):
        return f"the runner's jobs are not an object: {_short(jobs)}"
    for job_id, state in jobs.items():
        problem = _job_problem(job_id, state)
        if problem is not None:
            return problem
    return None


def _job_problem(job_id: str, state: Any) -> str | None:
    if not isinstance(state, dict):
        return f"the runner's status of job {job_id} is not an object: {_short(state)}"
    if not isinstance(state.get("state", ""), str):
        return f"the runner's state of job {job_id} is not a string: {_short(state.get('state'))}"
    for key in _TIMES:
        value = state.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, _NUMBER)):
            return f"the runner's {key} of job {job_id} is not a number: {_short(value)}"
    size = state.get("log_size")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 0):
        return f"the runner's log_size of job {job_id} is not a byte count: {_short(size)}"
    code = state.get("exit_status")
    if code is not None and (isinstance(code, bool) or not isinstance(code, int) or not -2**31 <= code < 2**31):
        return f"the runner's exit_status of job {job_id} is not an integer: {_short(code)}"
    return _probes_problem(job_id, state.get("probes"))


def _probes_problem(job_id: str, probes: Any) -> str | None:
    """``probes``: None, or one result per probe of the spec ({success_streak, last_error, ...})."""
    if probes is None:
        return None
    if not isinstance(probes, list) or len(probes) > MAX_PROBE_RESULTS:
        return f"the runner's probes of job {job_id} are not a list of results: {_short(probes)}"
    for result in probes:
        streak = result.get("success_streak") if isinstance(result, dict) else None
        if isinstance(streak, bool) or not isinstance(streak, int) or streak < 0:
            return f"the runner's probe result of job {job_id} has no success_streak: {_short(result)}"
        error = result.get("last_error")
        if error is not None and not isinstance(error, str):
            return f"the runner's probe error of job {job_id} is not a string: {_short(error)}"
        at = result.get("last_at")
        if at is not None and (isinstance(at, bool) or not isinstance(at, _NUMBER)):
            return f"the runner's probe time of job {job_id} is not a number: {_short(at)}"
    return None


def _short(value: Any) -> str:
    return repr(value)[:200]
