"""Registering an SSH fleet: every host is contacted, probed and given a runner before anything is written.

Hosts are contacted in parallel, one connection each, in two steps: first the host key and the
resource probe; then, once no host turned out to be a machine already registered (recognised by
its host key, however its address is spelled), the runner upload and start. Registration is all
or nothing: if any host fails, the runners started on the others are stopped again and the
request is refused with one error per failing host, naming it and the fix.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable
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
    FleetStatus,
    GroupKind,
    GroupStatus,
    Instance,
    InstanceGroup,
    InstanceReason,
    InstanceStatus,
    Placement,
)
from muster import crypto
from muster.api_errors import InvalidInput
from projects.models import Project

log = logging.getLogger(__name__)

MAX_PARALLEL = 32


@dataclass
class HostFacts:  # what contacting one host found out
    host_key: str
    probe: dict[str, Any]


def start_ssh_fleet(project: Project, conf: dict, actor: str = "api") -> Fleet:
    """Write the fleet and one pending instance per host after the checks that need no network.

    Nothing is contacted here: `complete_registration` (in the claimed step `register_fleet`,
    engine/registration.py) does that, so a slow or hostile host never holds the web request.
    """
    hosts: list[dict] = conf["ssh_config"]["hosts"]
    _refuse_server_paths(hosts)
    _refuse_registered_elsewhere(project, hosts, own_only=True)
    name = conf["name"]
    fleet_key = Counter(h["private_key"] for h in hosts).most_common(1)[0][0]
    try:
        with transaction.atomic():
            _refuse_registered_elsewhere(project, hosts, own_only=True)  # again: a concurrent apply may have won
            fleet = Fleet(project=project, name=name, backend=FleetBackend.SSH, status=FleetStatus.PENDING,
                          placement=conf.get("placement") or Placement.ANY, configuration=_stored_configuration(conf))
            fleet.private_key = fleet_key
            fleet.save()
            for i, host in enumerate(hosts):
                Instance.objects.create(
                    project=project, fleet=fleet, index=i, name=f"{name}-{i}", status=InstanceStatus.PENDING,
                    backend=FleetBackend.SSH, hostname=host["hostname"], port=host["port"], username=host["user"],
                    host_key=host.get("host_key") or "",  # given: the host must present exactly this key
                    private_key_encrypted=crypto.encrypt(host["private_key"]) if host["private_key"] != fleet_key else "",
                    # A runner home of its own per instance, named by nothing another fleet or project can
                    # reuse: two fleets on one login never share (or stop) each other's runner files and jobs.
                    backend_data={"runner_home": f"instances/{uuid.uuid4().hex}", "registration": "waiting"},
                )
            record(project.id, f"fleet {name}", f"registering {len(hosts)} ssh hosts", actor=actor)
    except IntegrityError as exc:
        # A concurrent request took the fleet name (or an instance name) between the checks and the insert.
        raise InvalidInput(["name"], f"fleet {name} (or an instance named {name}-N) already "
                                     "exists: delete it first or pick another name") from exc
    return fleet


def complete_registration(fleet: Fleet, token: str, actor: str = "server") -> None:
    """Contact, probe and start the runner on every host of a pending fleet; all or nothing.

    The caller holds the fleet's claim (`token`, engine/registration.py). Running it again after a
    partial run converges: the host keys recorded are the same hosts', and a runner agent already
    started in an instance's runner home is found running and kept (`ensure_agent`). An exception
    it does not expect is raised: the claimed step gives the fleet back to be registered again.
    """
    instances = list(fleet.instances.order_by("index"))
    targets = [inst.ssh_target() for inst in instances]
    hosts = [{"hostname": t.hostname, "port": t.port} for t in targets]
    started: list[HostFacts | None] = [None] * len(targets)
    try:
        facts, started = _contact_all(fleet, instances, targets)
        network = _common_network(fleet.placement, hosts, facts)
        with transaction.atomic():
            now = Fleet.objects.select_for_update().filter(pk=fleet.pk).values_list("status", "lease_token").first()
            if now is None:
                _stop_agents(targets, started)  # deleted while it registered
                return
            if tuple(now) != (FleetStatus.PENDING, token):
                # Our claim lapsed and another registration of the fleet took over: the agents are
                # its agents too (one runner home per instance), so they stay.
                log.warning("registering fleet %s: the claim was lost; the registration holding it goes on",
                            fleet.name)
                return
            _activate(fleet, instances, targets, facts, network, actor)
    except InvalidInput as exc:
        _stop_agents(targets, started)
        _fail(fleet, token, instances, exc.errors, actor)


def give_up(fleet: Fleet, token: str, why: str, actor: str) -> None:
    """Fail a registration that cannot complete (engine/registration.py: pending too long), stopping
    the agents earlier attempts started on hosts whose key they recorded."""
    instances = list(fleet.instances.order_by("index"))
    contacted = [i for i in instances if i.host_key]
    _stop_agents([i.ssh_target() for i in contacted], [HostFacts(i.host_key, {}) for i in contacted])
    _fail(fleet, token, instances, [{"loc": [], "msg": why}], actor)


def _fail(fleet: Fleet, token: str, instances: list[Instance], errors: list[dict], actor: str) -> None:
    by_host = {e["loc"][2]: e["msg"] for e in errors if e["loc"][:2] == ["ssh_config", "hosts"] and len(e["loc"]) > 2}
    with transaction.atomic():
        if not Fleet.objects.filter(pk=fleet.pk, status=FleetStatus.PENDING, lease_token=token).update(
                status=FleetStatus.FAILED, errors=errors):
            return
        for inst in instances:
            inst.status = InstanceStatus.TERMINATED
            inst.termination_reason = InstanceReason.REGISTRATION_FAILED
            if inst.index in by_host:
                step = f"failed: {by_host[inst.index]}"
            else:
                step = "not registered: " + ("another host failed" if by_host else errors[0]["msg"])
            inst.backend_data = {**inst.backend_data, "registration": step}
            inst.save(update_fields=["status", "termination_reason", "backend_data", "updated"])
        record(fleet.project_id, f"fleet {fleet.name}", "registration failed: " + "; ".join(e["msg"] for e in errors),
               actor=actor)


def _progress(instances: list[Instance], steps: dict[int, str]) -> None:
    for i, step in steps.items():
        inst = instances[i]
        inst.backend_data = {**inst.backend_data, "registration": step}
        Instance.objects.filter(pk=inst.pk).update(backend_data=inst.backend_data)


# ---- keys -------------------------------------------------------------------------------------


def _refuse_server_paths(hosts: list[dict]) -> None:
    # The server never opens a path it is sent: it would log in with the server's own keys, and
    # "cannot read" vs "not a key" would tell which server files exist. The message is the same
    # whatever the path is.
    for i, host in enumerate(hosts):
        if host.get("identity_file"):
            raise InvalidInput(
                ["ssh_config", "hosts", i, "identity_file"],
                f"host {host['hostname']}:{host['port']}: identity_file names a file on your machine, which "
                "the server does not read: send the key's content as `private_key` instead (the muster "
                "CLI reads identity_file and sends its content)",
            )


# ---- checks -----------------------------------------------------------------------------------


def _refuse_registered_elsewhere(project: Project, hosts: list[dict], facts: list[HostFacts] | None = None,
                                 fleet: Fleet | None = None, own_only: bool = False) -> None:
    """One machine sits in one live fleet: by address and port, and by host key once logged in.
    `own_only` (before any login): only this project's; another project's hosts are told only to
    whoever logs in with a key they accept, or registering would map other tenants' hosts."""
    live = Instance.objects.filter(backend=FleetBackend.SSH).exclude(status=InstanceStatus.TERMINATED)
    if own_only:
        live = live.filter(project=project)
    if fleet is not None:
        live = live.exclude(fleet=fleet)
    errors = []
    for i, host in enumerate(hosts):
        where = f"host {host['hostname']}:{host['port']}"
        taken = live.filter(hostname__iexact=host["hostname"], port=host["port"]).select_related("fleet").first()
        how = "is already registered"
        if taken is None and facts is not None:
            taken = live.filter(host_key=facts[i].host_key).select_related("fleet").first()
            how = "presents the host key of a machine already registered"
        if taken is None:
            continue
        if taken.project_id == project.id:
            msg = (f"{where} {how} as instance {taken.name} (fleet {taken.fleet.name if taken.fleet else '-'}): "
                   "delete that fleet first or remove the host from this one")
        else:
            # Another project's fleet and instance names are none of this project's business.
            msg = (f"{where} {how} in another project: it can be in one fleet at a time, so it must be "
                   "removed there first")
        errors.append({"loc": ["ssh_config", "hosts", i], "msg": msg})
    if facts is not None:
        first: dict[str, int] = {}
        for i, found in enumerate(facts):
            if found.host_key in first:
                errors.append({"loc": ["ssh_config", "hosts", i], "msg": (
                    f"host {hosts[i]['hostname']}:{hosts[i]['port']} is the same machine as hosts[{first[found.host_key]}] "
                    "(it presents the same host key): list each machine once")})
            first.setdefault(found.host_key, i)
    if errors:
        failure = InvalidInput(errors[0]["loc"], errors[0]["msg"])
        failure.errors = errors
        raise failure


def _common_network(placement: str, hosts: list[dict], facts: list[HostFacts]) -> str:
    """The private network all hosts share; a cluster whose hosts are on different networks is refused."""
    networks = {f.probe.get("network") for f in facts if f.probe.get("network")}
    if placement == Placement.CLUSTER and len(networks) > 1:
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
    return float(muster["SSH_TIMEOUT"]), float(muster["SSH_REGISTER_TIMEOUT"])


def _examine(runner: SSHRunnerHost) -> HostFacts:
    """Step one: the host key (checked against `host_key` when one is given) and the probe."""
    return HostFacts(host_key=runner.remote_host_key(), probe=runner.probe())


def _parallel(step: Callable[[int], Any], indexes: list[int], targets: list[SSHTarget], deadline: float,
              errors: dict[int, str]) -> dict[int, Any]:
    """step(i) for each index in threads, until `deadline`; failures go to `errors` by index."""
    results: dict[int, Any] = {}
    if not indexes:
        return results
    _timeout, overall = _timeouts()
    pool = ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(indexes)), thread_name_prefix="ssh-register")
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
                 targets: list[SSHTarget]) -> tuple[list[HostFacts], list[HostFacts | None]]:
    """(facts per host, facts of the hosts whose runner was started); InvalidInput names each failing host."""
    timeout, overall = _timeouts()
    deadline = time.monotonic() + overall
    runners = [SSHRunnerHost(t, timeout=timeout) for t in targets]
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
            _refuse_registered_elsewhere(fleet.project, hosts, [facts[i] for i in everyone], fleet=fleet)
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
        failure = InvalidInput(listed[0]["loc"], listed[0]["msg"])
        failure.errors = listed
        raise failure
    return [r for r in results if r is not None], ran


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
        "docker": probe.get("docker"),  # jobs with `image` run only where a daemon answered
    }


def _describe(resources: dict[str, Any]) -> str:
    gpus = resources["gpus"]
    gpu_text = f", {len(gpus)}x {gpus[0]['name'] or gpus[0]['vendor']}" if gpus else ""
    docker = f", Docker {resources['docker']['version']}" if resources.get("docker") else ", no Docker"
    return f"{resources['cpus']} cpus, {resources['memory_gb']:g} GB{gpu_text}{docker}"


def _activate(fleet: Fleet, instances: list[Instance], targets: list[SSHTarget], facts: list[HostFacts],
              network: str, actor: str) -> None:
    group = None
    if fleet.placement == Placement.CLUSTER:
        group = InstanceGroup.objects.create(project=fleet.project, fleet=fleet, name=_group_name(fleet.project, fleet.name),
                                             kind=GroupKind.CLUSTER, status=GroupStatus.ACTIVE)
    now = timezone.now()
    for inst, target, found in zip(instances, targets, facts, strict=True):
        resources = _resources(found.probe)
        inst.refresh_from_db(fields=["backend_data"])
        inst.group, inst.status, inst.resources = group, InstanceStatus.IDLE, resources
        inst.internal_ip = found.probe.get("internal_ip") or inst.hostname
        inst.host_key, inst.idle_since, inst.last_seen = found.host_key, now, now
        # the health check probes Docker again from SSH_DOCKER_PROBE_INTERVAL on (instances/services/docker_facts.py)
        inst.backend_data = {**inst.backend_data, "registration": "ready", "docker_probed_at": time.time()}
        inst.save()
        record(fleet.project_id, f"instance {inst.name}",
               f"registered {target.where} at {inst.internal_ip} ({_describe(resources)})",
               status=inst.status, actor=actor, instance_id=inst.id)
    fleet.network, fleet.status = network, FleetStatus.ACTIVE
    fleet.save(update_fields=["network", "status"])
    where = f" on network {network}" if network else ""
    record(fleet.project_id, f"fleet {fleet.name}", f"registered with {len(instances)} ssh hosts{where}", actor=actor)
