"""`muster attach`: a user's key on a job's host, allowed to forward to the job's ports only.

The CLI makes the key pair on the user's machine and sends only the public key; the private key
never leaves that machine, and nobody needs a copy of the fleet's key. The public key goes into the
fleet user's authorized_keys on the job's host, restricted to forwarding to the job's address and
ports (`restrict,port-forwarding,permitopen=...,command="/bin/false"`), and is removed when the job
ends (engine/stopping.py, where every job's end passes). docs/cli.md has the design.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import logging
import re

from django.conf import settings

from instances.models import FleetBackend
from muster.api_errors import InvalidInput
from runs.choices import JobStatus
from runs.models import Job, Run

log = logging.getLogger(__name__)

KEY_TYPES = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521", "ssh-rsa")
PUBLIC_KEY = re.compile(r"(?P<type>[a-z0-9-]{1,40}) (?P<data>[A-Za-z0-9+/]{16,4096}={0,3})(?: [\x21-\x7e]{0,100})?")
ATTACHABLE = (JobStatus.PULLING, JobStatus.RUNNING)


def marker(job: Job) -> str:
    return f"muster-attach-{job.pk}"


def parse_public_key(text: object) -> str:
    """`type base64` of an OpenSSH public key; anything else (options, newlines) is refused, since
    the line is written into authorized_keys."""
    found = PUBLIC_KEY.fullmatch(text.strip()) if isinstance(text, str) else None
    if not found or found["type"] not in KEY_TYPES:
        raise InvalidInput(["public_key"], "an OpenSSH public key on one line: `ssh-ed25519 AAAA...` "
                           "(the CLI makes one in ~/.muster/attach_key.pub)")
    try:
        blob = base64.b64decode(found["data"], validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInput(["public_key"], "the key's base64 does not decode") from None
    # the blob starts with its own type name: a key pasted under the wrong type is refused here
    if blob[4:4 + len(found["type"])] != found["type"].encode():
        raise InvalidInput(["public_key"], f"the key data is not a {found['type']} key")
    return f"{found['type']} {found['data']}"


def job_ports(job: Job) -> list[int]:
    """The job's own ports (a `LOCAL:JOB` mapping names the job's side second)."""
    groups = (job.run.configuration or {}).get("groups") or []
    # the group's ports are stored once in the run's configuration, not in each job row
    group = groups[job.node_group_index] if 0 <= job.node_group_index < len(groups) else {}
    ports = []
    for port in group.get("ports") or (job.spec or {}).get("ports") or []:
        text = str(port).rsplit(":", 1)[-1]
        if text.isdigit() and 0 < int(text) < 65536:
            ports.append(int(text))
    return list(dict.fromkeys(ports))


def authorized_keys_path() -> str:
    return settings.MUSTER["ATTACH_AUTHORIZED_KEYS"]


def key_line(job: Job, public_key: str, ip: str, ports: list[int]) -> str:
    # the address comes from the host's own probe: only a plain IP goes into the options
    host = f"[{ip}]" if ipaddress.ip_address(ip).version == 6 else ip  # sshd's form for IPv6
    opens = ",".join(f'permitopen="{host}:{port}"' for port in ports)
    return f'restrict,port-forwarding,{opens},command="/bin/false" {public_key} {marker(job)}'


ATTACH_EVENT = "attach key installed"


def attach(run: Run, job_num: int, public_key: object, actor: str = "server") -> dict:
    """Where the CLI connects to reach job `job_num`'s ports, after allowing its key there."""
    key = parse_public_key(public_key)
    job = run.current_jobs().select_related("instance", "instance__fleet").filter(job_num=job_num).first()
    if job is None:
        raise InvalidInput(["job"], f"run {run.name} has no job {job_num}")
    if job.status not in ATTACHABLE or job.instance is None:
        raise InvalidInput(["job"], f"job {job_num} of run {run.name} is {job.status}: "
                           "attach once it is running")
    inst = job.instance
    ports = job_ports(job)
    info = {"job": job_num, "backend": inst.backend, "ip": inst.internal_ip, "ports": ports,
            "node_group_name": job.node_group_name, "node_group_rank": job.node_group_rank}
    if inst.backend == FleetBackend.LOCAL:
        return info  # the job listens on this machine's loopback: nothing to forward
    if inst.backend != FleetBackend.SSH:
        raise InvalidInput(["job"], f"attach reaches jobs on ssh and local fleets; this job is on {inst.backend}")
    if not ports:
        raise InvalidInput(["job"], f"job {job_num} has no ports to forward: list them under `ports`")
    try:
        ipaddress.ip_address(inst.internal_ip or "")
    except ValueError:
        raise InvalidInput(["job"], f"host {inst.name} has no valid address ({inst.internal_ip!r})") from None
    from backends.registry import compute_for_instance
    from backends.ssh import attach_keys
    from events.services import record

    # recorded before the install, so a key whose install answer was lost is still removed at the end
    record(run.project_id, f"job {run.name}/{job_num}", f"{ATTACH_EVENT} on {inst.name} by {actor}: "
           f"forwarding to {inst.internal_ip}:{','.join(map(str, ports))}", actor=actor, run_id=run.pk,
           job_id=job.pk, instance_id=inst.pk)
    host = compute_for_instance(inst).runner_host(inst)
    try:
        attach_keys.install(host, authorized_keys_path(), key_line(job, key, inst.internal_ip, ports))
    finally:
        host.close()
    target = inst.ssh_target()
    return {**info, "ssh": {"hostname": target.hostname, "port": target.port, "username": target.username,
                            "host_key": target.host_key}}


def revoke(job: Job, host) -> None:
    """Remove the attach keys of `job` from its host, if anyone attached to it (one more SSH
    command only for jobs that were attached to)."""
    if job.instance is None or job.instance.backend != FleetBackend.SSH:
        return
    from backends.ssh import attach_keys
    from events.models import Event

    if Event.objects.filter(job_id=job.pk, message__startswith=ATTACH_EVENT).exists():
        attach_keys.remove(host, authorized_keys_path(), marker(job))
        log.info("attach keys of %s removed from %s", job, job.instance.name)
