"""scale_service: a service's replica groups follow, each on its own, the requests per second its
endpoint counted (`metric: rps`) or the queue depth their replicas report (`metric: queue`).

Beat sends `scale_services` every MUSTER_SCALING_INTERVAL seconds; it takes each live service run
whose groups scale (`replicas: A..B` with `scaling`) in turn: first, holding nothing, it scrapes the
replicas of its queue groups (the user's code, which may hang: seconds that process_run must not
wait out, its nudges bouncing off a held run until the sweep), then it claims the run, briefly, for
the step that decides, and for rps groups:

- samples serving.stats.requests_total (the endpoint processes' count, summed) and keeps the
  samples of the last `scaling.window` seconds in Run.scaling (the step's memory: only the step
  holding the run writes it);
- rps = the requests between the oldest kept sample and now, over the window (or the seconds
  between them, when more): a service's first samples count from its submission;
- per scaled group, wants ceil(rps / target) within A..B, and takes it as dstack's autoscaler
  does: a rise only once scale_up_delay has passed since the group last scaled, a fall only once
  scale_down_delay has; from zero at once when a request came (the endpoint holds it for a replica);
- for queue groups, takes what the scrapes found (each ready replica's gauge; none if the run's
  deployment moved on since they read its jobs) and wants ceil(queue depth / target), with the same
  bounds and delays (engine/replicas/queue_depth.py: how the depth is averaged; a group whose depth
  is not known, no replica having answered within the window, stays as it is);
- writes desired_replicas, the memory and an event with its give-back, and nudges process_run,
  which adds the replicas or drains the newest (engine/replicas/keep.py: out of the endpoint's pool
  and the routers' lists first, stopped a drain delay later).

The beat tick is its own safety net: a tick lost or a run held by process_run at that moment is
sampled at the next one (the rps is over the samples' real times, so a late sample only widens it).
"""

from __future__ import annotations

import logging
import math
import time
from functools import partial

from engine import claims, messages, outcome
from engine.replicas import queue_depth
from runs.choices import RunStatus
from runs.configuration.stored import StoredGroup, StoredScaling, StoredService, run_configuration
from runs.models import Run
from serving.stats import requests_total

log = logging.getLogger(__name__)

LIVE = (RunStatus.SUBMITTED, RunStatus.PROVISIONING, RunStatus.RUNNING)


def scale_services() -> int:
    """Beat's task body: every live service with a group that scales, sampled; returns how many were."""
    done = 0
    for run in Run.objects.filter(status__in=LIVE, stop_requested="").exclude(desired_replicas={}).only(
            "id", "configuration", "deployment_num"):
        if not scaled_groups(run):
            continue
        try:
            scraped = _scrape(run)
        except Exception:  # as a claimed step's body would be: this run not scaled at this tick, the others are
            log.exception("scale_service: scraping the replicas of run %s failed; it is looked at next tick", run.pk)
            continue
        if claims.claimed(Run, run.pk, "scale_service", partial(_scale, scraped), status__in=LIVE,
                          stop_requested="") is not None:
            done += 1
    return done


def _scrape(run: Run) -> queue_depth.Scraped:
    """The queue groups' replicas scraped, the run not held (from the configuration read unclaimed:
    the step takes the readings only if the run's deployment is still the one they were made for)."""
    conf = run_configuration(run)
    queue = [g for g in scaled_groups(run) if g.scaling and g.scaling.metric == "queue"]
    if not queue:
        return queue_depth.Scraped(run.deployment_num)
    assert isinstance(conf, StoredService)
    return queue_depth.scrape(run, queue, conf.port)


def scaled_groups(run: Run) -> list[StoredGroup]:
    conf = run_configuration(run)
    if not isinstance(conf, StoredService):
        return []
    return [g for g in conf.groups if g.scaling is not None and g.replicas is not None
            and g.replicas.min != g.replicas.max]


def decide(measure: float, scaling: StoredScaling, low: int, high: int, current: int, since_scaled: float,
           new_requests: int) -> int:
    """The replicas a group wants now, `measure` being its rps or its queue depth (the group's, not
    per replica): ceil(measure / target) within low..high, after the delays (pure:
    tests/engine/test_scaling_steps.py)."""
    wanted = min(max(math.ceil(measure / scaling.target) if scaling.target > 0 else high, low), high)
    if current == 0 and new_requests > 0:
        return max(wanted, min(1, high))  # a request waits at the endpoint: no delay from zero
    if wanted > current and since_scaled < scaling.scale_up_delay:
        return current
    if wanted < current and since_scaled < scaling.scale_down_delay:
        return current
    return wanted


def _scale(scraped: queue_depth.Scraped, held: claims.Held) -> claims.Outcome:
    run = Run.objects.select_related("project").get(pk=held.pk)
    groups = scaled_groups(run)
    now = time.time()
    memory = dict(run.scaling or {})
    kept: dict = {}
    looked: dict[str, tuple[float, int, str]] = {}  # group: (its measure, requests since the last tick, said how)
    by_rps = [g for g in groups if g.scaling and g.scaling.metric != "queue"]
    by_queue = [g for g in groups if g.scaling and g.scaling.metric == "queue"]
    if by_rps:
        rps, new_requests, kept["samples"] = _rps(run, by_rps, memory, now)
        kept["rps"] = round(rps, 3)
        looked.update({g.name: (rps, new_requests, f"{rps:.1f} rps") for g in by_rps})
    if by_queue and scraped.deployment_num != run.deployment_num:
        return claims.Outcome()  # an update since the scrape: given back as it is, the next tick looks again
    if by_queue:
        depths, queue_memory = queue_depth.look(run, by_queue, memory, now, scraped)
        kept.update(queue_memory)
        looked.update({name: (depth, 0, f"a queue of {depth:.1f}") for name, depth in depths.items()
                       if depth is not None})  # not known: the group stays as it is
    desired = dict(run.desired_replicas or {})
    marks = dict(memory.get("groups", {}))
    decisions = int(memory.get("decisions", 0))
    for group in groups:
        assert group.scaling is not None and group.replicas is not None
        if group.name not in looked:
            continue
        measure, new_requests, said = looked[group.name]
        current = int(desired.get(group.name, group.replicas.min))
        since = now - float(marks.get(group.name, {}).get("at", run.submitted_at.timestamp()))
        wanted = decide(measure, group.scaling, group.replicas.min, group.replicas.max, current, since, new_requests)
        if wanted == current:
            continue
        desired[group.name] = wanted
        marks[group.name] = {"at": now}
        decisions += 1
        per = " per replica" if group.scaling.metric == "queue" else ""
        outcome.learn(run, event=outcome.event(
            run.project_id, f"run {run.name}", f"scaled {group.name} {current} → {wanted}: {said} against a "
            f"target of {group.scaling.target:g}{per}", status=run.status, run_id=run.pk))
    memory = {**kept, "groups": marks, "decisions": decisions}
    changed = desired != (run.desired_replicas or {})
    fields = {"scaling": memory, **({"desired_replicas": desired} if changed else {})}
    # an update (runs/services/service_runs.py) writes desired_replicas without the run's lease: counts
    # worked out from the deployment read here would undo it, so they are written only if it still holds
    return outcome.with_learned(run, then=(partial(messages.process_run, run.pk),) if changed else (),
                                where={"deployment_num": run.deployment_num}, **fields)


def _rps(run: Run, groups: list[StoredGroup], memory: dict, now: float) -> tuple[float, int, list]:
    """(the endpoint's requests per second over the window, the requests since the last sample, the
    samples to keep)."""
    total = requests_total(run.pk)
    window = max(g.scaling.window for g in groups if g.scaling)
    # before its first sample, the service's submission is one: no request counted yet
    earlier = memory.get("samples") or [[run.submitted_at.timestamp(), 0]]
    samples = [s for s in earlier if now - s[0] <= window] + [[now, total]]
    last = earlier[-1]
    oldest = samples[0] if len(samples) > 1 else last
    # over the whole window, as dstack counts it: a burst shorter than the window weighs its share
    rps = (total - oldest[1]) / max(now - oldest[0], window)
    return rps, max(0, total - int(last[1])), samples
