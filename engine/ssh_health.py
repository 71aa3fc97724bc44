"""Reachability of SSH hosts nobody is talking to (idle ones, or ones already marked unreachable).

Busy hosts are looked at on every poll of their job (engine/running/observe.py), which keeps `last_seen`
fresh. Idle hosts are not, so a host that went away would only be noticed when a run lands on it.
`check_ssh_hosts` (called by the sweep) connects to every live SSH host not seen for SSH_HEALTH_INTERVAL
seconds and asks its runner for status: one short round trip each, in parallel threads.

Each checked instance is leased for SSH_HEALTH_INTERVAL seconds, so concurrent sweeps never check a host
twice, and a host that stays unreachable (its `last_seen` never moves) is retried at that pace,
not on every sweep.

A host that answers also has its Docker facts refreshed, at a slower pace (instances/docker_facts.py).
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from backends.base import BackendError, RunnerHost
from backends.registry import GIVEN_HOSTS, ssh_runner_host
from engine import claims, health
from engine.tuning import DOCKER_PROBE_TIMEOUT, HEALTH_BATCH, HEALTH_THREADS
from instances import docker_facts
from instances.models import Instance, InstanceStatus

log = logging.getLogger(__name__)



def check_ssh_hosts(now: datetime | None = None) -> int:
    """Look at live SSH hosts not seen recently; mark them reachable or not. Returns how many were checked."""
    now = now or timezone.now()
    every = float(settings.MUSTER["SSH_HEALTH_INTERVAL"])
    due = Instance.objects.filter(
        Q(last_seen__isnull=True) | Q(last_seen__lt=now - timedelta(seconds=every)),
        backend=GIVEN_HOSTS, status__in=[InstanceStatus.IDLE, InstanceStatus.BUSY],
    )
    # Not released afterwards on purpose: the lease is what spaces the checks of one host.
    _token, pks = claims.claim_batch(due, HEALTH_BATCH, seconds=every, renew=False)
    if not pks:
        return 0
    instances = list(Instance.objects.filter(pk__in=pks).select_related("fleet"))
    timeout = float(settings.MUSTER["SSH_HEALTH_TIMEOUT"])
    with ThreadPoolExecutor(max_workers=min(HEALTH_THREADS, len(instances)), thread_name_prefix="ssh-health") as pool:
        # Threads only talk SSH; every database write happens here, on the caller's connection.
        outcomes = list(pool.map(lambda inst: _check_host(inst, timeout), instances))
    for inst, (error, docker) in zip(instances, outcomes, strict=True):
        if error is None:
            health.mark_reachable(inst)
            docker_facts.store(inst, docker)
        else:
            health.mark_unreachable(inst, error)
    return len(instances)


def _check_host(instance: Instance, timeout: float) -> tuple[str | None, object]:
    """(None when the host answered over SSH, else why not; its Docker facts when probed, else
    docker_facts.UNCHANGED). A missing agent is not an outage."""
    host = ssh_runner_host(instance.ssh_target(), timeout)
    try:
        host.status()
        return None, _probe_docker(instance, host)
    except BackendError as exc:
        return str(exc), docker_facts.UNCHANGED
    except Exception as exc:  # never let one odd host stop the sweep
        log.exception("health check of %s failed", instance.name)
        return f"{type(exc).__name__}: {exc}", docker_facts.UNCHANGED
    finally:
        host.close()


def _probe_docker(instance: Instance, host: RunnerHost) -> object:
    """In a health check's thread, on a host that just answered: its Docker facts when a probe is
    due and succeeds, else UNCHANGED. Never writes to the database."""
    if not docker_facts.due(instance):
        return docker_facts.UNCHANGED
    try:
        return host.probe_docker(timeout=DOCKER_PROBE_TIMEOUT)
    except Exception as exc:  # noqa: BLE001 - a failed probe keeps what is known
        log.info("Docker probe of %s failed: %s", instance.name, exc)
        return docker_facts.UNCHANGED
