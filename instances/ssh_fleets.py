"""Registering an SSH fleet: every host is contacted, probed and given a runner before anything is written.

Hosts are contacted in parallel (one connection each: host key, resource probe, runner upload and
start). Registration is all or nothing: if any host fails, the runners started on the others are
stopped again and the request is refused with one error per failing host, naming it and the fix.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from backends.base import BackendError
from backends.ssh.connection import SSHTarget
from backends.ssh.runner_host import SSHRunnerHost
from events.services import record
from instances.models import (
    Fleet,
    FleetBackend,
    GroupKind,
    GroupStatus,
    Instance,
    InstanceGroup,
    InstanceStatus,
)
from muster import crypto
from muster.api_errors import InvalidInput
from projects.models import Project

log = logging.getLogger(__name__)

DEFAULT_CONNECT_TIMEOUT = 10.0  # one connect / one command
DEFAULT_REGISTER_TIMEOUT = 60.0  # everything for one host: connect, probe, upload, start the agent
MAX_PARALLEL = 32


@dataclass
class HostFacts:
    """What contacting one host found out."""

    host_key: str
    probe: dict[str, Any]


def register_ssh_fleet(project: Project, conf: dict, actor: str = "api") -> Fleet:
    hosts: list[dict] = conf["ssh_config"]["hosts"]
    placement = conf.get("placement") or "any"
    targets = [_target(i, host) for i, host in enumerate(hosts)]
    _refuse_registered_elsewhere(hosts)
    facts = _contact_all(targets)  # raises (after stopping what it started) when any host fails
    try:
        network = _common_network(placement, hosts, facts)
        with transaction.atomic():
            _refuse_registered_elsewhere(hosts)  # again, inside the transaction: a concurrent apply may have won
            return _write(project, conf, hosts, targets, facts, network, actor)
    except (IntegrityError, InvalidInput) as exc:
        _stop_agents(targets, facts)
        if isinstance(exc, InvalidInput):
            raise
        # A concurrent request took the fleet name (or an instance name) between the checks and the insert.
        raise InvalidInput(["name"], f"fleet {conf['name']} (or an instance named {conf['name']}-N) already "
                                     "exists: delete it first or pick another name") from exc


# ---- keys -------------------------------------------------------------------------------------


def _target(i: int, host: dict) -> SSHTarget:
    return SSHTarget(
        hostname=host["hostname"], port=host["port"], username=host["user"], private_key=_private_key(i, host)
    )


def _private_key(i: int, host: dict) -> str:
    if host.get("private_key"):
        return host["private_key"]
    # identity_file names a file on the client; the CLI sends its content. Reading it here only helps
    # when client and server share a machine (a dev setup, the tests).
    path = os.path.expanduser(host.get("identity_file") or "")
    if path and os.path.isfile(path):
        try:
            with open(path) as f:
                return f.read()
        except OSError as exc:
            raise InvalidInput(["ssh_config", "hosts", i], f"cannot read identity_file {path}: {exc}") from exc
    raise InvalidInput(
        ["ssh_config", "hosts", i],
        f"host {host['hostname']}:{host['port']}: identity_file {host.get('identity_file')!r} is a path on your "
        "machine, not on the server: send the key's content as `private_key` (the muster CLI does this)",
    )


# ---- checks -----------------------------------------------------------------------------------


def _refuse_registered_elsewhere(hosts: list[dict]) -> None:
    for i, host in enumerate(hosts):
        taken = (
            Instance.objects.filter(hostname__iexact=host["hostname"], port=host["port"])
            .exclude(status=InstanceStatus.TERMINATED)
            .select_related("fleet", "project")
            .first()
        )
        if taken is not None:
            raise InvalidInput(
                ["ssh_config", "hosts", i],
                f"host {host['hostname']}:{host['port']} is already registered as instance {taken.name} "
                f"(fleet {taken.fleet.name if taken.fleet else '-'}, project {taken.project.name}): delete that "
                "fleet first or remove the host from this one",
            )


def _common_network(placement: str, hosts: list[dict], facts: list[HostFacts]) -> str:
    """The private network all hosts share; a cluster whose hosts are on different networks is refused."""
    networks = {f.probe.get("network") for f in facts if f.probe.get("network")}
    if placement == "cluster" and len(networks) > 1:
        where = ", ".join(
            f"{h['hostname']}:{h['port']} ({f.probe.get('internal_ip')} in {f.probe.get('network') or 'unknown'})"
            for h, f in zip(hosts, facts, strict=True)
        )
        raise InvalidInput(
            ["placement"],
            f"placement: cluster needs every host on one private network, but they are on {len(networks)}: "
            f"{where}. Register hosts that share a network, or use placement: any",
        )
    return networks.pop() if len(networks) == 1 else ""


# ---- contacting hosts -------------------------------------------------------------------------


def _timeouts() -> tuple[float, float]:
    muster = settings.MUSTER
    return (float(muster.get("SSH_TIMEOUT", DEFAULT_CONNECT_TIMEOUT)),
            float(muster.get("SSH_REGISTER_TIMEOUT", DEFAULT_REGISTER_TIMEOUT)))


def _contact(target: SSHTarget, timeout: float) -> HostFacts:
    """One connection: record the host key on first contact, probe, install and start the runner."""
    runner = SSHRunnerHost(target, timeout=timeout)
    try:
        host_key = runner.remote_host_key()
        facts = runner.probe()
        runner.ensure_agent()
        return HostFacts(host_key=host_key, probe=facts)
    finally:
        runner.close()


def _contact_all(targets: list[SSHTarget]) -> list[HostFacts]:
    timeout, overall = _timeouts()
    pool = ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(targets)), thread_name_prefix="ssh-register")
    try:
        futures = [pool.submit(_contact, t, timeout) for t in targets]
        wait(futures, timeout=overall)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)  # a hung host must not hold the request
    results: list[HostFacts | None] = []
    errors: list[dict] = []
    for i, (target, future) in enumerate(zip(targets, futures, strict=True)):
        loc = ["ssh_config", "hosts", i]
        where = f"host {target.hostname}:{target.port}"
        if not future.done():
            results.append(None)
            errors.append({"loc": loc, "msg": f"{where} did not finish registering within {overall:g} s (connect, "
                                              "probe and runner start); check that it answers SSH promptly"})
            continue
        exc = future.exception()
        if exc is None:
            results.append(future.result())
            continue
        results.append(None)
        errors.append({"loc": loc, "msg": _message(where, exc)})
    if errors:
        _stop_agents(targets, results)
        failure = InvalidInput(errors[0]["loc"], errors[0]["msg"])
        failure.errors = errors
        raise failure
    return [r for r in results if r is not None]


def _message(where: str, exc: BaseException) -> str:
    if isinstance(exc, BackendError):
        # SSH and runner errors already say what to check; prefixing the host keeps every message uniform.
        return f"{where}: {exc}"
    log.exception("registering %s failed unexpectedly", where, exc_info=exc)
    return f"{where}: unexpected error while registering ({type(exc).__name__}: {exc})"


def _stop_agents(targets: list[SSHTarget], results: list[HostFacts | None]) -> None:
    """Undo the runner starts of a refused registration (best effort: the hosts are the user's)."""
    started = [replace(t, host_key=r.host_key) for t, r in zip(targets, results, strict=True) if r is not None]
    if not started:
        return
    timeout, _ = _timeouts()

    def stop(target: SSHTarget) -> None:
        runner = SSHRunnerHost(target, timeout=timeout)
        try:
            runner.stop_agent()
        except BackendError as exc:
            log.info("could not stop the runner on %s after a refused registration: %s", target.where, exc)
        finally:
            runner.close()

    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(started))) as pool:
        list(pool.map(stop, started))


# ---- writing ----------------------------------------------------------------------------------


def _fleet_key(targets: list[SSHTarget]) -> str:
    # The checked configuration has each host's key already resolved; the most common one is the
    # fleet's, and hosts with a different key keep their own on the instance.
    return Counter(t.private_key for t in targets).most_common(1)[0][0]


def _stored_configuration(conf: dict) -> dict:
    ssh = conf["ssh_config"]
    hosts = [{k: v for k, v in h.items() if k != "private_key"} for h in ssh["hosts"]]
    return {**conf, "ssh_config": {**{k: v for k, v in ssh.items() if k != "private_key"}, "hosts": hosts}}


def _group_name(project: Project, fleet_name: str) -> str:
    live = InstanceGroup.objects.filter(project=project).exclude(status=GroupStatus.TERMINATED)
    for candidate in (fleet_name, f"{fleet_name}-cluster", *(f"{fleet_name}-cluster-{n}" for n in range(2, 100))):
        if not live.filter(name=candidate).exists():
            return candidate
    raise InvalidInput(["name"], f"too many live instance groups are named after {fleet_name}; pick another name")


def _resources(probe: dict[str, Any]) -> dict[str, Any]:
    return {
        "cpus": probe["cpus"], "memory_gb": probe["memory_gb"], "disk_gb": probe["disk_gb"],
        "cpu_arch": probe["cpu_arch"],
        "gpus": [{"name": g["name"], "memory_gb": g["memory_gb"], "vendor": g["vendor"]} for g in probe["gpus"]],
        "tpu": None,
    }


def _describe(resources: dict[str, Any]) -> str:
    gpus = resources["gpus"]
    gpu_text = f", {len(gpus)}x {gpus[0]['name'] or gpus[0]['vendor']}" if gpus else ""
    return f"{resources['cpus']} cpus, {resources['memory_gb']:g} GB{gpu_text}"


def _write(project: Project, conf: dict, hosts: list[dict], targets: list[SSHTarget], facts: list[HostFacts],
           network: str, actor: str) -> Fleet:
    name = conf["name"]
    placement = conf.get("placement") or "any"
    fleet_key = _fleet_key(targets)
    fleet = Fleet(project=project, name=name, backend=FleetBackend.SSH, placement=placement,
                  configuration=_stored_configuration(conf), network=network)
    fleet.private_key = fleet_key
    fleet.save()
    group = None
    if placement == "cluster":
        group = InstanceGroup.objects.create(project=project, fleet=fleet, name=_group_name(project, name),
                                             kind=GroupKind.CLUSTER, status=GroupStatus.ACTIVE)
    now = timezone.now()
    for i, (host, target, found) in enumerate(zip(hosts, targets, facts, strict=True)):
        resources = _resources(found.probe)
        inst = Instance.objects.create(
            project=project, fleet=fleet, group=group, index=i, name=f"{name}-{i}", status=InstanceStatus.IDLE,
            backend=FleetBackend.SSH, hostname=host["hostname"], port=host["port"], username=host["user"],
            internal_ip=found.probe.get("internal_ip") or host["hostname"], host_key=found.host_key,
            private_key_encrypted=crypto.encrypt(target.private_key) if target.private_key != fleet_key else "",
            resources=resources, idle_since=now, last_seen=now,
        )
        record(project.id, f"instance {inst.name}",
               f"registered {target.where} at {inst.internal_ip} ({_describe(resources)})",
               status=inst.status, actor=actor, instance_id=inst.id)
    where = f" on network {network}" if network else ""
    record(project.id, f"fleet {name}", f"registered with {len(hosts)} ssh hosts{where}", actor=actor)
    return fleet
