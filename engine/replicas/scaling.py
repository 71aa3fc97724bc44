"""scale_service: a service's replicas follow the requests per second its endpoint counted.

Beat sends `scale_services` every MUSTER_SCALING_INTERVAL seconds; it claims each live service run
whose groups scale (`replicas: A..B` with `scaling: {metric: rps}`) in turn, and the claimed step:

- samples serving.stats.requests_total (the endpoint processes' count, summed) and keeps the
  samples of the last `scaling.window` seconds in Run.scaling (the step's memory: only the step
  holding the run writes it);
- rps = the requests between the oldest kept sample and now, over the window (or the seconds
  between them, when more): a service's first samples count from its submission;
- per scaled group, wants ceil(rps / target) within A..B, and takes it as dstack's autoscaler
  does: a rise only once scale_up_delay has passed since the group last scaled, a fall only once
  scale_down_delay has; from zero at once when a request came (the endpoint holds it for a replica);
- writes desired_replicas, the memory and an event with its give-back, and nudges process_run,
  which adds the replicas or drains the newest (engine/replicas/keep.py).

The beat tick is its own safety net: a tick lost or a run held by process_run at that moment is
sampled at the next one (the rps is over the samples' real times, so a late sample only widens it).
"""

from __future__ import annotations

import math
import time
from functools import partial

from engine import claims, messages, outcome
from runs.choices import RunStatus
from runs.configuration.stored import StoredGroup, StoredScaling, StoredService, run_configuration
from runs.models import Run
from serving.stats import requests_total

LIVE = (RunStatus.SUBMITTED, RunStatus.PROVISIONING, RunStatus.RUNNING)


def scale_services() -> int:
    """Beat's task body: every live service with a group that scales, sampled; returns how many were."""
    done = 0
    for run in Run.objects.filter(status__in=LIVE, stop_requested="").exclude(desired_replicas={}).only(
            "id", "configuration"):
        if scaled_groups(run) and claims.claimed(Run, run.pk, "scale_service", _scale, status__in=LIVE,
                                                 stop_requested="") is not None:
            done += 1
    return done


def scaled_groups(run: Run) -> list[StoredGroup]:
    conf = run_configuration(run)
    if not isinstance(conf, StoredService):
        return []
    return [g for g in conf.groups if g.scaling is not None and g.replicas is not None
            and g.replicas.min != g.replicas.max]


def decide(rps: float, scaling: StoredScaling, low: int, high: int, current: int, since_scaled: float,
           new_requests: int) -> int:
    """The replicas a group wants now (pure: tests/engine/test_scaling_decisions.py)."""
    wanted = min(max(math.ceil(rps / scaling.target) if scaling.target > 0 else high, low), high)
    if current == 0 and new_requests > 0:
        return max(wanted, min(1, high))  # a request waits at the endpoint: no delay from zero
    if wanted > current and since_scaled < scaling.scale_up_delay:
        return current
    if wanted < current and since_scaled < scaling.scale_down_delay:
        return current
    return wanted


def _scale(held: claims.Held) -> claims.Outcome:
    run = Run.objects.select_related("project").get(pk=held.pk)
    groups = scaled_groups(run)
    now = time.time()
    total = requests_total(run.pk)
    memory = dict(run.scaling or {})
    window = max(g.scaling.window for g in groups if g.scaling)
    # before its first sample, the service's submission is one: no request counted yet
    earlier = memory.get("samples") or [[run.submitted_at.timestamp(), 0]]
    samples = [s for s in earlier if now - s[0] <= window] + [[now, total]]
    last = earlier[-1]
    oldest = samples[0] if len(samples) > 1 else last
    # over the whole window, as dstack counts it: a burst shorter than the window weighs its share
    rps = (total - oldest[1]) / max(now - oldest[0], window)
    desired = dict(run.desired_replicas or {})
    marks = dict(memory.get("groups", {}))
    decisions = int(memory.get("decisions", 0))
    for group in groups:
        assert group.scaling is not None and group.replicas is not None
        current = int(desired.get(group.name, group.replicas.min))
        since = now - float(marks.get(group.name, {}).get("at", run.submitted_at.timestamp()))
        wanted = decide(rps, group.scaling, group.replicas.min, group.replicas.max, current, since,
                        max(0, total - int(last[1])))
        if wanted == current:
            continue
        desired[group.name] = wanted
        marks[group.name] = {"at": now}
        decisions += 1
        outcome.learn(run, event=outcome.event(
            run.project_id, f"run {run.name}", f"scaled {group.name} {current} → {wanted}: {rps:.1f} rps against a "
            f"target of {group.scaling.target:g}", status=run.status, run_id=run.pk))
    memory = {"samples": samples, "rps": round(rps, 3), "groups": marks, "decisions": decisions}
    changed = desired != (run.desired_replicas or {})
    fields = {"scaling": memory, **({"desired_replicas": desired} if changed else {})}
    # an update (runs/services/service_runs.py) writes desired_replicas without the run's lease: counts
    # worked out from the deployment read here would undo it, so they are written only if it still holds
    return outcome.with_learned(run, then=(partial(messages.process_run, run.pk),) if changed else (),
                                where={"deployment_num": run.deployment_num}, **fields)
