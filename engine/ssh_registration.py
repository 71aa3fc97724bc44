"""Registering an SSH fleet's hosts, in the claimed step `register_fleet` (engine/registration.py):
every host is contacted, probed and given a runner before anything is written.

Hosts are contacted in parallel, one connection each, in two steps: first the host key and the
resource probe; then, once no host turned out to be a machine already registered (recognised by
its host key, however its address is spelled), the runner upload and start. Registration is all
or nothing: if any host fails, the runners started on the others are stopped again and the
fleet fails with one error per failing host, naming it and the fix.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, replace
from functools import partial
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from backends.base import BackendError, RunnerHost
from backends.registry import ssh_runner_host, ssh_target
from engine import claims, groups, messages
from engine.errors import Refused, RegistrationRefused
from engine.tuning import REGISTER_THREADS
from instances.models import (
    Fleet,
    FleetStatus,
    GroupKind,
    GroupStatus,
    Instance,
    InstanceGroup,
    InstanceReason,
    InstanceStatus,
    Placement,
)
from instances.ssh_hosts import registered_elsewhere
from instances.transitions import NOT_TERMINATED, move_fleet, move_instances
from muster import crypto
from muster.claimable import Lease
from projects.models import Project

log = logging.getLogger(__name__)


@dataclass
class HostFacts:  # what contacting one host found out
    host_key: str
    probe: dict[str, Any]


def complete_registration(fleet: Fleet, actor: str = "server") -> claims.Outcome:
    """Contact, probe and start the runner on every host of a pending fleet; all or nothing.

    The hosts are contacted with the fleet held (engine/registration.py); what they answered is
    written by the Outcome's move, under the claim, so a registration whose lease ran out while it
    waited on a slow host writes nothing. Running it again after a partial run converges: the
    host keys recorded are the same hosts', and a runner agent already started in an instance's
    runner home is found running and kept (`ensure_agent`). An exception it does not expect is
    raised: the claimed step gives the fleet back to be registered again.
    """
    instances = list(fleet.instances.order_by("index"))
    targets = [inst.ssh_target() for inst in instances]
    hosts = [{"hostname": t.hostname, "port": t.port} for t in targets]
    started: list[HostFacts | None] = [None] * len(targets)
    try:
        facts, started = _contact_all(fleet, instances, targets)
        network = _common_network(fleet.placement, hosts, facts)
    except RegistrationRefused as exc:
        _stop_agents(targets, started)
        return claims.Outcome(move=partial(_fail, fleet, instances, exc.errors, actor))
    return claims.Outcome(move=partial(_activate_if_held, fleet, instances, targets, facts, started, network, actor))


def give_up(fleet: Fleet, why: str, actor: str) -> claims.Outcome:
    """Fail a registration that cannot complete (engine/registration.py: pending too long), stopping
    the agents earlier attempts started on hosts whose key they recorded."""
    instances = list(fleet.instances.order_by("index"))
    contacted = [i for i in instances if i.host_key]
    _stop_agents([i.ssh_target() for i in contacted], [HostFacts(i.host_key, {}) for i in contacted])
    return claims.Outcome(move=partial(_fail, fleet, instances, [{"loc": [], "msg": why}], actor))


# The moves below are Outcome.move: given the step's lease, they write only while it still holds the
# fleet, and clear the lease in the fleet's own UPDATE (claims.give_back).


def _activate_if_held(fleet: Fleet, instances: list[Instance], targets: list[Any], facts: list[HostFacts],
                      started: list[HostFacts | None], network: str, actor: str, *, lease: Lease) -> bool:
    with transaction.atomic():
        row = Fleet.objects.select_for_update().filter(pk=fleet.pk)
        if not row.exists():
            # deleted while it registered: nothing is left to give back, and the agents started are
            # stopped by a worker once this transaction is over (no host is contacted inside one)
            _stop_later(targets, started)
            return True
        if not row.filter(status=FleetStatus.PENDING, **lease.guard()).exists():
            # Our claim lapsed and another registration of the fleet took over: the agents are
            # its agents too (one runner home per instance), so they stay.
            log.warning("registering fleet %s: the claim was lost; the registration holding it goes on",
                        fleet.name)
            return False
        _activate(fleet, instances, targets, facts, network, actor, lease)
        return True


def _fail(fleet: Fleet, instances: list[Instance], errors: list[dict], actor: str, *, lease: Lease) -> bool:
    by_host = {e["loc"][2]: e["msg"] for e in errors if e["loc"][:2] == ["ssh_config", "hosts"] and len(e["loc"]) > 2}
    with transaction.atomic():
        if not move_fleet(fleet, FleetStatus.FAILED, frm=[FleetStatus.PENDING], lease=lease,
                          message="registration failed: " + "; ".join(e["msg"] for e in errors), actor=actor,
                          errors=errors):
            return False
        for inst in instances:
            if inst.index in by_host:
                step = f"failed: {by_host[inst.index]}"
            else:
                step = "not registered: " + ("another host failed" if by_host else errors[0]["msg"])
            message = f"registration {step}" if inst.index in by_host else step
            move_instances([inst], InstanceStatus.TERMINATED, frm=NOT_TERMINATED, message=message,
                           actor=actor, termination_reason=InstanceReason.REGISTRATION_FAILED,
                           backend_data={**inst.backend_data, "registration": step})
    return True


def _progress(instances: list[Instance], steps: dict[int, str]) -> None:
    for i, step in steps.items():
        inst = instances[i]
        inst.backend_data = {**inst.backend_data, "registration": step}
        Instance.objects.filter(pk=inst.pk).update(backend_data=inst.backend_data)


# ---- checks -----------------------------------------------------------------------------------


def _common_network(placement: str, hosts: list[dict], facts: list[HostFacts]) -> str:
    """The private network all hosts share; a cluster whose hosts are on different networks is refused."""
    networks = {f.probe.get("network") for f in facts if f.probe.get("network")}
    if placement == Placement.CLUSTER and len(networks) > 1:
        where = ", ".join(
            f"{h['hostname']}:{h['port']} ({f.probe.get('internal_ip')} in {f.probe.get('network') or 'unknown'})"
            for h, f in zip(hosts, facts, strict=True)
        )
        raise RegistrationRefused(
            ["placement"],
            f"placement: cluster needs every host on one private network, but they are on {len(networks)}: "
            f"{where}. Register hosts that share a network, or use placement: any",
        )
    return networks.pop() if len(networks) == 1 else ""


# ---- contacting hosts -------------------------------------------------------------------------


def _timeouts() -> tuple[float, float]:
    muster = settings.MUSTER
    return float(muster["SSH_TIMEOUT"]), float(muster["SSH_REGISTER_TIMEOUT"])


def _examine(runner: RunnerHost) -> HostFacts:
    """Step one: the host key (checked against `host_key` when one is given) and the probe."""
    return HostFacts(host_key=runner.remote_host_key(), probe=runner.probe())


def _parallel(step: Callable[[int], Any], indexes: list[int], targets: list[Any], deadline: float,
              errors: dict[int, str]) -> dict[int, Any]:
    """step(i) for each index in threads, until `deadline`; failures go to `errors` by index."""
    results: dict[int, Any] = {}
    if not indexes:
        return results
    _timeout, overall = _timeouts()
    pool = ThreadPoolExecutor(max_workers=min(REGISTER_THREADS, len(indexes)), thread_name_prefix="ssh-register")
    try:
        futures = {i: pool.submit(step, i) for i in indexes}
        wait(futures.values(), timeout=max(0.0, deadline - time.monotonic()))
    finally:
        pool.shutdown(wait=False, cancel_futures=True)  # a hung host must not hold the request
    for i, future in futures.items():
        where = f"host {targets[i].hostname}:{targets[i].port}"
        if not future.done():
            errors[i] = (f"{where} did not finish registering within {overall:g} s (connect, probe and runner "
                         "start); check that it answers SSH promptly")
        elif future.exception() is not None:
            errors[i] = _message(where, future.exception())
        else:
            results[i] = future.result()
    return results


def _contact_all(fleet: Fleet, instances: list[Instance],
                 targets: list[Any]) -> tuple[list[HostFacts], list[HostFacts | None]]:
    """(facts per host, facts of the hosts whose runner was started); RegistrationRefused names each failing host."""
    timeout, overall = _timeouts()
    deadline = time.monotonic() + overall
    runners = [ssh_runner_host(t, timeout) for t in targets]
    errors: dict[int, str] = {}
    facts: dict[int, HostFacts] = {}
    started: dict[int, None] = {}
    everyone = list(range(len(targets)))
    try:
        _progress(instances, dict.fromkeys(everyone, "connecting and probing"))
        facts = _parallel(lambda i: _examine(runners[i]), everyone, targets, deadline, errors)
        _progress(instances, {i: f"probed: {_describe(_resources(f.probe))}" for i, f in facts.items()})
        if not errors:  # else nothing was started anywhere yet, and nothing is
            # Recorded before the check, so two registrations of one machine racing each other see
            # each other's key and both refuse, rather than both passing.
            for i, found in facts.items():
                Instance.objects.filter(pk=instances[i].pk).update(host_key=found.host_key)
            hosts = [{"hostname": t.hostname, "port": t.port} for t in targets]
            taken = registered_elsewhere(fleet.project, hosts, [facts[i] for i in everyone], fleet=fleet)
            if taken:
                raise RegistrationRefused.of(taken)
            _progress(instances, dict.fromkeys(everyone, "starting the runner"))
            started = _parallel(lambda i: runners[i].ensure_agent(revive=True), everyone, targets, deadline, errors)
    finally:
        for runner in runners:
            runner.close()
    results = [facts.get(i) for i in everyone]
    ran = [r if i in started else None for i, r in enumerate(results)]
    if errors:
        _stop_agents(targets, ran)
        listed = [{"loc": ["ssh_config", "hosts", i], "msg": errors[i]} for i in sorted(errors)]
        raise RegistrationRefused.of(listed)
    return [r for r in results if r is not None], ran


def _message(where: str, exc: BaseException) -> str:
    if isinstance(exc, BackendError):
        # SSH and runner errors already say what to check; prefixing the host keeps every message uniform.
        return f"{where}: {exc}"
    log.exception("registering %s failed unexpectedly", where, exc_info=exc)
    return f"{where}: unexpected error while registering ({type(exc).__name__}: {exc})"


def _started(targets: list[Any], results: list[HostFacts | None]) -> list[Any]:
    return [replace(t, host_key=r.host_key) for t, r in zip(targets, results, strict=True) if r is not None]


def _stop_agents(targets: list[Any], results: list[HostFacts | None]) -> None:
    """Undo the runner starts of a refused registration (best effort: the hosts are the user's)."""
    _stop_on(_started(targets, results))


def _stop_on(started: list[Any]) -> None:
    timeout, _ = _timeouts()
    groups.stop_agents_on([(t.where, ssh_runner_host(t, timeout)) for t in started])


def _stop_later(targets: list[Any], results: list[HostFacts | None]) -> None:
    """`_stop_agents` as a message (messages.stop_registered_agents), sent after commit: the hosts
    travel with it (their rows may be gone with the fleet), each key encrypted as the database holds it."""
    messages.stop_registered_agents([{**asdict(t), "private_key": crypto.encrypt(t.private_key)}
                                     for t in _started(targets, results)])


def stop_registered_agents(hosts: list[dict]) -> None:
    """Task body of stop_registered_agents: the agents a registration started, stopped (best effort)."""
    _stop_on([ssh_target(**{**h, "private_key": crypto.decrypt(h["private_key"])}) for h in hosts])


# ---- writing ----------------------------------------------------------------------------------


def _group_name(project: Project, fleet_name: str) -> str:
    live = InstanceGroup.objects.filter(project=project).exclude(status=GroupStatus.TERMINATED)
    for candidate in (fleet_name, f"{fleet_name}-cluster", *(f"{fleet_name}-cluster-{n}" for n in range(2, 100))):
        if not live.filter(name=candidate).exists():
            return candidate
    raise Refused(["name"], f"too many live instance groups are named after {fleet_name}; pick another name")


def _resources(probe: dict[str, Any]) -> dict[str, Any]:
    return {
        "cpus": probe["cpus"], "memory_gb": probe["memory_gb"], "disk_gb": probe["disk_gb"],
        "cpu_arch": probe["cpu_arch"],
        "gpus": [{"name": g["name"], "memory_gb": g["memory_gb"], "vendor": g["vendor"]} for g in probe["gpus"]],
        "tpu": None,
        "docker": probe.get("docker"),  # jobs with `image` run only where a daemon answered
    }


def _describe(resources: dict[str, Any]) -> str:
    gpus = resources["gpus"]
    gpu_text = f", {len(gpus)}x {gpus[0]['name'] or gpus[0]['vendor']}" if gpus else ""
    docker = f", Docker {resources['docker']['version']}" if resources.get("docker") else ", no Docker"
    return f"{resources['cpus']} cpus, {resources['memory_gb']:g} GB{gpu_text}{docker}"


def _activate(fleet: Fleet, instances: list[Instance], targets: list[Any], facts: list[HostFacts],
              network: str, actor: str, lease: Lease) -> None:
    group = None
    if fleet.placement == Placement.CLUSTER:
        group = InstanceGroup.objects.create(project=fleet.project, fleet=fleet, name=_group_name(fleet.project, fleet.name),
                                             kind=GroupKind.CLUSTER, status=GroupStatus.ACTIVE)
    now = timezone.now()
    for inst, target, found in zip(instances, targets, facts, strict=True):
        resources = _resources(found.probe)
        inst.refresh_from_db(fields=["backend_data"])
        internal_ip = found.probe.get("internal_ip") or inst.hostname
        # the health check probes Docker again from SSH_DOCKER_PROBE_INTERVAL on (instances/docker_facts.py)
        move_instances([inst], InstanceStatus.IDLE, frm=[InstanceStatus.PENDING], actor=actor,
                       message=f"registered {target.where} at {internal_ip} ({_describe(resources)})",
                       group=group, resources=resources, **Instance.resource_columns(resources),
                       internal_ip=internal_ip, host_key=found.host_key, idle_since=now, last_seen=now,
                       backend_data={**inst.backend_data, "registration": "ready", "docker_probed_at": time.time()})
    where = f" on network {network}" if network else ""
    move_fleet(fleet, FleetStatus.ACTIVE, frm=[FleetStatus.PENDING], network=network, actor=actor,
               message=f"registered with {len(instances)} ssh hosts{where}", lease=lease)
