"""`scaling: {metric: queue}`: a replica group's queue depth, read from the gauge its replicas serve.

At each of the scaler's ticks (engine/replicas/scaling.py), every ready head of a queue-scaled group
not being drained (serving.replicas.is_ready / is_head: the replica's node 0, the one that serves) is
asked for `metrics_path` on `metrics_port` (serving/replica_http.py: a timeout and a size cap on each
answer, and one budget for the run's scrapes), and `queue_metric` is read from the Prometheus text it
answers (serving/prometheus_text.py: its series summed). The scrapes (`scrape`) run before the run is
claimed, a few at once (tuning.SCRAPE_PARALLEL): a replica is the user's code and may hang, and neither
process_run nor the other replicas' scrapes wait on it. What they found is then taken into the run's
memory (`look`) inside the scaler's claimed step, which is brief.

The group's queue at that tick is the average over the replicas that answered, times the group's
ready replicas: the sum of what they reported, a replica whose scrape failed counted as the average
(left out of the average, not counted as an empty queue). A replica idle beside busy ones (a new
one, or a revision not yet sent traffic) reports 0 and so adds no load, only its share of the mean. Those totals are kept for the last `window` seconds in
Run.scaling["queue"][group], and their mean is the group's queue depth, from which the scaler wants
ceil(depth / target) replicas (Kubernetes HPA's AverageValue rule: ceil(sum / target per pod)).
A tick where no replica answered adds no sample, and a group with no sample in its window is not
scaled at all: a scrape that fails never reads as an empty queue.

A replica whose scrape fails gets an event when it first fails and again every SCRAPE_FAILURE_EVENT_EVERY
seconds while it keeps failing (not one per tick), and one when it answers again.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from django.db import connections

from engine import outcome, tuning
from runs.configuration.stored import StoredGroup
from runs.models import Run
from serving.prometheus_text import gauge_value
from serving.replica_http import ReplicaAnswerTooLarge, ReplicaHTTPError, ReplicaUnreachable, request
from serving.replicas import is_head, is_ready

SCRAPE_MAX_BYTES = 4 * 1024 * 1024  # a vLLM or SGLang /metrics is tens of kB


@dataclass(frozen=True)
class Scraped:
    """What one tick's scrapes of a run found, before the run was claimed: per group, each replica
    asked with its gauge's value, or None and why not. `deployment_num`: the run's when its jobs were
    read (the claimed step takes the readings only if it is still the run's)."""

    deployment_num: int
    groups: dict[str, list[tuple[object, float | None, str | None]]] = field(default_factory=dict)


def scrape(run: Run, groups: list[StoredGroup], service_port: int) -> Scraped:
    """Ask every ready head of `groups` for its gauge, a few at once; no row is held meanwhile."""
    deadline = time.monotonic() + tuning.SCRAPE_TICK_BUDGET
    # a draining replica is leaving: what it still has queued is finished there, not a need for capacity
    jobs = [j for j in run.current_jobs().select_related("instance", "instance__fleet")
            if is_ready(j) and is_head(j) and j.drain_at is None]
    asks = []
    for group in groups:
        scaling = group.scaling
        assert scaling is not None and scaling.queue_metric is not None
        asks += [(group.name, job, scaling.metrics_port or service_port, scaling.metrics_path, scaling.queue_metric)
                 for job in jobs if job.node_group_name == group.name]
    scraped = Scraped(run.deployment_num, {group.name: [] for group in groups})
    if not asks:
        return scraped
    with ThreadPoolExecutor(max_workers=min(tuning.SCRAPE_PARALLEL, len(asks)), thread_name_prefix="scrape") as pool:
        answers = list(pool.map(lambda ask: _ask(*ask[1:], deadline), asks))  # in the order asked
    for (name, job, *_), (value, why) in zip(asks, answers, strict=True):
        scraped.groups[name].append((job, value, why))
    return scraped


def _ask(job, port: int, path: str, metric: str, deadline: float) -> tuple[float | None, str | None]:
    """One scrape on a pool thread: (its value, None) or (None, why not)."""
    found: list = []
    try:
        why = _scrape(job, port, path, metric, deadline, found)
    finally:
        connections.close_all()  # this thread's own (an SSH host's key is read on it): none left open
    return (found[0] if found else None), why


def look(run: Run, groups: list[StoredGroup], memory: dict, now: float, scraped: Scraped) -> tuple[dict, dict]:
    """({group: its queue depth over the window, or None: not known}, the memory's queue parts), from
    what `scrape` found; inside the scaler's claimed step (the memory and the events are the run's)."""
    earlier = memory.get("queue") or {}
    kept: dict[str, list] = {}  # a group no longer queue-scaled (an update) leaves its samples behind
    unscraped = dict(memory.get("unscraped") or {})
    depths: dict[str, float | None] = {}
    heads = set()
    for group in groups:
        scaling = group.scaling
        assert scaling is not None
        members = scraped.groups.get(group.name, [])  # none: queue-scaled since the scrape, no sample this tick
        heads.update(str(job.pk) for job, _, _ in members)
        found = []
        for job, value, why in members:
            if value is not None:
                found.append(value)
            _note(run, job, why, unscraped, now)
        samples = [s for s in earlier.get(group.name, []) if now - s[0] <= scaling.window]
        if found:
            samples.append([now, round(sum(found) / len(found) * len(members), 3)])
        kept[group.name] = samples
        depths[group.name] = sum(s[1] for s in samples) / len(samples) if samples else None
    parts = {"queue": kept, "queue_depth": {k: None if v is None else round(v, 3) for k, v in depths.items()},
             "unscraped": {k: v for k, v in unscraped.items() if k in heads}}
    return depths, parts


def _scrape(job, port: int, path: str, metric: str, deadline: float, found: list) -> str | None:
    """Scrape one replica: its depth appended to `found`, or why not."""
    left = deadline - time.monotonic()
    if left <= 0:
        return f"not asked: this tick's {tuning.SCRAPE_TICK_BUDGET:g}s for scrapes ran out"
    try:
        answer = request(job, port, "GET", path, timeout=min(tuning.SCRAPE_TIMEOUT, left), max_bytes=SCRAPE_MAX_BYTES)
    except ReplicaAnswerTooLarge:
        return f"its answer on :{port}{path} is over {SCRAPE_MAX_BYTES // (1024 * 1024)} MiB"
    except ReplicaUnreachable as exc:
        return f"no answer ({exc})"
    except ReplicaHTTPError as exc:  # every kind: one replica's failure never fails the tick of every group
        return str(exc)
    if answer.status != 200:
        return f":{port}{path} answered HTTP {answer.status}"
    value = gauge_value(answer.body.decode("utf-8", "replace"), metric)
    if value is None:
        return f":{port}{path} has no number for {metric}"
    found.append(value)
    return None


def _note(run: Run, job, why: str | None, unscraped: dict, now: float) -> None:
    """An event for a failing scrape, rate-limited per replica; one when it answers again."""
    key, last = str(job.pk), unscraped.get(str(job.pk))
    replica = f"replica {job.node_group_name}/{job.replica_num}"
    if why is None:
        if last is not None:
            unscraped.pop(key)
            _event(run, f"the queue of {replica} is read again: back in the scaling average")
        return
    if last is not None and now - float(last) < tuning.SCRAPE_FAILURE_EVENT_EVERY:
        return
    unscraped[key] = now
    _event(run, f"cannot read the queue of {replica}: {why}; left out of the scaling average (said again every "
                f"{tuning.SCRAPE_FAILURE_EVENT_EVERY / 60:g} min while it lasts)")


def _event(run: Run, message: str) -> None:
    outcome.learn(run, event=outcome.event(run.project_id, f"run {run.name}", message, status=run.status,
                                           run_id=run.pk))
