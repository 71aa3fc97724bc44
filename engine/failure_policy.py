"""What a failed job means for its run under its group's `on_failure` (runs/configuration/failure_policy.py).

Pure decisions over the stored configuration and the run's restart record; engine/restarts.py
acts on them. A failure no rule matches is left to the run's `retry` (engine/processing.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from runs.choices import FAILING_REASONS, RETRY_EVENT, JobReason
from runs.configuration.stored import StoredGroup, run_configuration
from runs.models import Job, Run

FAIL_RUN, RESTART_GROUP, RESTART_RUN, IGNORE = "fail-run", "restart-group", "restart-run", "ignore"
ERROR, INTERRUPTION = "error", "interruption"
_GROUP_REFERENCE = re.compile(r"\$\{\{\s*groups\[(\d+)\]")


def group_of(run: Run, index: int) -> StoredGroup:
    return run_configuration(run).group(index)


def max_restarts(run: Run, index: int) -> int:
    return group_of(run, index).max_restarts


def event_of(job: Job) -> str | None:
    return RETRY_EVENT.get(job.termination_reason)


def matched_action(run: Run, job: Job) -> str | None:
    """The action of the first rule of the job's group that matches its failure; None: no rule did."""
    event = event_of(job)
    if event not in (ERROR, INTERRUPTION):
        return None
    for rule in group_of(run, job.node_group_index).on_failure:
        if event not in rule.on_events:
            continue
        if rule.on_exit_codes and (event != ERROR or job.exit_status not in rule.on_exit_codes):
            continue
        return rule.action
    return None


def restart_record(run: Run, index: int) -> dict:
    return (run.restarts or {}).get(str(index)) or {}


def keeps_host(job: Job) -> bool:
    """Whether the job's host stays busy when it ends: its group restarts on the same hosts.

    Read by finish_job, which may run before process_run has decided: the same inputs give the
    same answer (a restart already decided for this submission, or budget left). A host kept for
    a restart that then does not happen (another group failed the run) is handed back when the
    run ends (restarts.hand_back_kept).
    """
    if job.keep_host:
        return True
    run = job.run
    conf = run_configuration(run)
    if conf.type == "service" and _replica_keeps_host(job, conf):
        return True
    if job.node_group_index == 0 or event_of(job) != ERROR or matched_action(run, job) != RESTART_GROUP:
        return False  # group 0 holds rank 0: its restart is the run's, on whatever hosts fit
    record = restart_record(run, job.node_group_index)
    if record.get("submission") == job.submission_num:
        return not record.get("spent")
    return int(record.get("count", 0)) < max_restarts(run, job.node_group_index)


def _replica_keeps_host(job: Job, conf) -> bool:
    """A node of a service's multi-host replica that failed with an error keeps its host when the
    service's `retry` lists errors: the replica restarts as one on the hosts it had after its back-off
    (engine/replicas/nodes.py), and a host given back meanwhile may be taken, or deleted with its
    slice (a replica's TPU slice goes once all its hosts are idle, engine/pods.py). The keeper hands
    the hosts back when the replica does not restart after all (engine/replicas/nodes.py let_go,
    restart; restarts.hand_back_kept when the run ends)."""
    if int((job.spec or {}).get("nodes_in_group") or 1) < 2 or job.superseded or event_of(job) != ERROR:
        return False
    return conf.retry is not None and ERROR in conf.retry.on_events


def is_replacement(job: Job) -> bool:
    """A job ended because one slice of its set is being made again (engine/slice_replace.py): an
    interruption that keeps its host, which no other interruption does. Its group restarts on the
    same hosts, group 0 included (the kept slices and the new one are the set's hosts)."""
    return bool(job.keep_host) and job.termination_reason == JobReason.INTERRUPTED_BY_NO_CAPACITY


def referencing_groups(run: Run, index: int) -> set[int]:
    """Groups whose commands or env name group `index`'s addresses, or that `depends_on` it."""
    groups = run_configuration(run).groups
    name = group_of(run, index).name
    found = set()
    for i, group in enumerate(groups):
        if i == index:
            continue
        texts = [*group.commands, *group.env.values()]
        if any(str(index) in _GROUP_REFERENCE.findall(str(t)) for t in texts):
            found.add(i)
        if any(dep.group == name for dep in group.depends_on):
            found.add(i)
    return found


@dataclass
class Verdict:
    """What the run's failed jobs add up to; the first of these that is set is what happens."""

    spent: Job | None = None  # a restart whose group's budget is used up: retry_limit_exceeded
    fail: Job | None = None  # no rule, or fail-run, or an ignored group with every node failed
    restart_run: Job | None = None
    restart: dict[int, Job] = field(default_factory=dict)  # group index -> the failure restarting it
    ignored: set[int] = field(default_factory=set)  # job pks whose failure the run goes on without


def judge(run: Run, jobs: list[Job], failed: list[Job]) -> Verdict:
    verdict = Verdict()
    for job in failed:
        if is_replacement(job):
            if _budget_spent(run, job):
                verdict.spent = verdict.spent or job
            else:
                verdict.restart.setdefault(job.node_group_index, job)
            continue
        action = matched_action(run, job)
        if action == RESTART_GROUP and (job.node_group_index == 0 or (
                event_of(job) == INTERRUPTION and 0 in referencing_groups(run, job.node_group_index))):
            action = RESTART_RUN  # rank 0's group restarts: every other node was started with its address
        if action is None or action == FAIL_RUN:
            verdict.fail = verdict.fail or job
        elif action == IGNORE:
            group = [j for j in jobs if j.node_group_index == job.node_group_index]
            if all(j.termination_reason in FAILING_REASONS for j in group):
                verdict.fail = verdict.fail or job
            verdict.ignored.add(job.pk)
        elif _budget_spent(run, job):
            verdict.spent = verdict.spent or job
        elif action == RESTART_RUN:
            verdict.restart_run = verdict.restart_run or job
        else:
            verdict.restart.setdefault(job.node_group_index, job)
    return verdict


def _budget_spent(run: Run, job: Job) -> bool:
    record = restart_record(run, job.node_group_index)
    if record.get("submission") == job.submission_num:
        return bool(record.get("spent"))  # decided already for this failure
    return int(record.get("count", 0)) >= max_restarts(run, job.node_group_index)
