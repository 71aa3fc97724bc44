"""`muster attach`: a user's key on a job's host, allowed to forward to the job's ports only.

The CLI makes the key pair on the user's machine and sends only the public key; the private key
never leaves that machine, and nobody needs a copy of the fleet's key. The public key goes into the
fleet user's authorized_keys on the job's host, restricted to forwarding to the job's address and
ports (`restrict,command="... muster_runner.pyz forward --to IP --ports P"`: no forwarding, a
forced command that carries one connection per session). Each line has its AttachGrant row,
written first; the line is removed when the job ends (engine/finishing.py, where every job's end
passes) or its user loses access (runs/signals.py, then engine/attach_revokes.py), and the row
only once the line is gone. docs/cli.md has the design.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import logging
import re

from django.db import transaction

from instances.models import FleetBackend
from muster.api_errors import InvalidInput
from runs.choices import JobStatus
from runs.models import AttachGrant, Job, Run

log = logging.getLogger(__name__)

KEY_TYPES = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521", "ssh-rsa")
PUBLIC_KEY = re.compile(r"(?P<type>[a-z0-9-]{1,40}) (?P<data>[A-Za-z0-9+/]{16,4096}={0,3})(?: [\x21-\x7e]{0,100})?")
ATTACHABLE = (JobStatus.PULLING, JobStatus.RUNNING)


def marker(job_id: int, grant_id: int, username: str) -> str:
    """The line's comment: which job and grant it is (what removal matches, up to the last dash)
    and whose key it is (for whoever reads the file); only characters safe in a shell word."""
    return f"muster-attach-{job_id}-{grant_id}-{re.sub(r'[^A-Za-z0-9@.+_-]', '_', username)[:60]}"


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


def key_line(grant: AttachGrant, public_key: str, ip: str, ports: list[int], host) -> str:
    """`restrict` with no forwarding at all, and a forced command that carries one connection to
    one of the job's ports over the session itself (the runner's `forward`). A `port-forwarding`
    key cannot be held to the job's ports: `permitopen` leaves -R open, `permitlisten` bounds TCP
    listeners only, and OpenSSH (9.2 here) lets any Unix-socket -R or -L through whatever the lists
    say. docs/cli.md has the design."""
    # the address comes from the host's own probe: only a plain IP goes into the command
    ip = str(ipaddress.ip_address(ip))
    from backends.registry import attach_keys

    keys = attach_keys()
    forward = host.forward_command(ip, ports, keys.path_expr(keys.authorized_keys_path()), grant.marker)
    # sshd's own quoting of a command="..." option: a double quote is written \"
    return f'restrict,command="{forward.replace(chr(34), chr(92) + chr(34))}" {public_key} {grant.marker}'


ATTACH_EVENT = "attach key installed"


class HostDidNotAnswer(InvalidInput):
    status_code = 503


def attach(run: Run, job_num: int, public_key: object, actor: str = "server", user=None) -> dict:
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
    from backends.base import BackendError
    from backends.registry import attach_keys, compute_for_instance
    from engine import messages
    from events.services import record

    grant = _grant(job, run, user, actor)
    record(run.project_id, f"job {run.name}/{job_num}", f"{ATTACH_EVENT} on {inst.name} by {actor}: "
           f"forwarding to {inst.internal_ip}:{','.join(map(str, ports))}", actor=actor, run_id=run.pk,
           job_id=job.pk, instance_id=inst.pk)
    host = compute_for_instance(inst).runner_host(inst)
    keys = attach_keys()
    try:
        try:
            keys.install(host, keys.authorized_keys_path(), key_line(grant, key, inst.internal_ip, ports, host))
        except BackendError as exc:
            # the line may be there (the answer was lost): it goes with the grant, by a worker
            AttachGrant.objects.filter(pk=grant.pk).update(revoke_due=True)
            messages.revoke_attach_keys(inst.pk)
            raise HostDidNotAnswer(["job"], f"the key could not be installed on {inst.name}: {exc}; "
                                   "try again") from None
        # Looked at after the line is in: a revoke that marked the grant (or even removed its
        # row) before this found no line yet, so the line goes here; one that marks it after
        # this look removes the line itself.
        if not AttachGrant.objects.filter(pk=grant.pk, revoke_due=False).exists():
            keys.remove(host, keys.authorized_keys_path(), [grant.needle])
            AttachGrant.objects.filter(pk=grant.pk).delete()
            raise InvalidInput(["job"], f"job {job_num} of run {run.name} ended while attaching")
    finally:
        host.close()
    target = inst.ssh_target()
    return {**info, "ssh": {"hostname": target.hostname, "port": target.port, "username": target.username,
                            "host_key": target.host_key}}


def _grant(job: Job, run: Run, user, actor: str) -> AttachGrant:
    """The grant row, written (and committed) before its line goes to the host, and only while the
    job is attachable: the job's row lock orders this against the job's end (engine/finishing.py),
    which marks every grant of the job due after its status has left ATTACHABLE."""
    with transaction.atomic():
        locked = Job.objects.select_for_update().get(pk=job.pk)
        if locked.status not in ATTACHABLE:
            raise InvalidInput(["job"], f"job {job.job_num} of run {run.name} is {locked.status}: attach once it is running")
        user = user if getattr(user, "pk", None) else None
        grant = AttachGrant.objects.create(job=job, instance_id=job.instance_id, project_id=run.project_id, user=user)
        grant.marker = marker(job.pk, grant.pk, getattr(user, "username", "") or actor)
        grant.save(update_fields=["marker"])
    return grant


def revoke_for(user_id: int, project_id: int | None = None) -> int:
    """A user lost access (left the project, lost every token, was deactivated or deleted): their
    lines are due to go; a worker removes them from each host (engine/attach_revokes.py)."""
    from engine import messages

    grants = AttachGrant.objects.filter(user_id=user_id)
    if project_id is not None:
        grants = grants.filter(project_id=project_id)
    instances = set(grants.values_list("instance_id", flat=True))
    grants.update(revoke_due=True)
    for instance_id in instances:
        messages.revoke_attach_keys(instance_id)
    return len(instances)
