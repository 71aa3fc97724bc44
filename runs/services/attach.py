"""`muster attach`: a user's key on a job's host, allowed to forward to the job's ports only.

The CLI makes the key pair on the user's machine and sends only the public key; the private key
never leaves that machine, and nobody needs a copy of the fleet's key. The public key goes into the
fleet user's authorized_keys on the job's host, restricted to forwarding to the job's address and
ports (`restrict,command="... muster_runner.pyz forward --to IP --ports P"`: no forwarding, a
forced command that carries one connection per session). Each line has its AttachGrant row,
written first, by the request, which answers 202 without contacting the host: a worker installs
the line (engine/attach_installs.py) while the CLI polls the grant. The line is removed when the job ends (engine/finishing.py, where every job's end
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

from backends.registry import LOCAL_HOSTS, user_keys_over_ssh
from muster.api_errors import InvalidInput
from runs.choices import JOB_ATTACHABLE as ATTACHABLE
from runs.models import AttachGrant, Job, Run

log = logging.getLogger(__name__)

KEY_TYPES = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521", "ssh-rsa")
PUBLIC_KEY = re.compile(r"(?P<type>[a-z0-9-]{1,40}) (?P<data>[A-Za-z0-9+/]{16,4096}={0,3})(?: [\x21-\x7e]{0,100})?")


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


def attach(run: Run, job_num: int, public_key: object, actor: str = "server", user=None) -> dict:
    """What the CLI needs to reach job `job_num`'s ports; on an SSH host, the grant whose line a
    worker installs (engine/attach_installs.py): the request itself does not contact the host."""
    key = parse_public_key(public_key)
    job = running_job(run, job_num, "attach")
    inst = job.instance
    ports = job_ports(job)
    info = {"job": job_num, "backend": inst.backend, "ip": inst.internal_ip, "ports": ports,
            "node_group_name": job.node_group_name, "node_group_rank": job.node_group_rank}
    if inst.backend == LOCAL_HOSTS:
        return info  # the job listens on this machine's loopback: nothing to forward
    reached_over_ssh(job, "attach")
    if not ports:
        raise InvalidInput(["job"], f"job {job_num} has no ports to forward: list them under `ports`")
    grant = grant_for(job, run, user, actor, key, ports)
    return {**info, "id": grant.pk, "status": INSTALLING}


def running_job(run: Run, job_num: int, what: str) -> Job:
    """Job `job_num` of the run's current submission, on its host and pulling or running."""
    job = run.current_jobs().select_related("instance", "instance__fleet").filter(job_num=job_num).first()
    if job is None:
        raise InvalidInput(["job"], f"run {run.name} has no job {job_num}")
    if job.status not in ATTACHABLE or job.instance is None:
        raise InvalidInput(["job"], f"job {job_num} of run {run.name} is {job.status}: "
                           f"{what} once it is running")
    return job


def reached_over_ssh(job: Job, what: str) -> None:
    """A user's key can go onto the job's host: ssh fleets' hosts and TPU VMs (gcp), at a valid address."""
    inst = job.instance
    if not user_keys_over_ssh(inst.backend):
        raise InvalidInput(["job"], f"{what} reaches jobs on hosts Muster logs in to over SSH (ssh and gcp "
                           f"fleets); job {job.job_num} is on a {inst.backend} host")
    try:
        ipaddress.ip_address(inst.internal_ip or "")
    except ValueError:
        raise InvalidInput(["job"], f"host {inst.name} has no valid address ({inst.internal_ip!r})") from None


INSTALLING, INSTALLED, WITHDRAWN = "installing", "installed", "withdrawn"


def attach_status(run: Run, grant_id: int, user=None) -> dict:
    """Where an attach stands (`muster attach` polls it after the 202): `installing` (with the last
    try's error, if any), `installed` with where to connect, or `withdrawn` when the grant went
    (its job ended or its user lost access) before its line was in. Only the grant's own user
    sees it; anybody else gets the 404 an unknown grant gets."""
    grant = (AttachGrant.objects.select_related("job", "instance", "instance__fleet")
             .filter(pk=grant_id, project_id=run.project_id, job__run=run).first())
    if grant is not None and getattr(user, "pk", None) is not None and grant.user_id != user.pk:
        grant = None
    if grant is None or grant.revoke_due:
        return {"id": grant_id, "status": WITHDRAWN,
                "error": f"the attach key was withdrawn before it was installed: run {run.name}'s job ended, "
                         "or you lost access to the project"}
    job, inst = grant.job, grant.instance
    info = {"id": grant.pk, "job": job.job_num, "backend": inst.backend, "ip": inst.internal_ip,
            "ports": list(grant.ports), "shell": grant.shell, "node_group_name": job.node_group_name,
            "node_group_rank": job.node_group_rank}
    if grant.install_due:
        return {**info, "status": INSTALLING, "error": grant.install_error}
    target = inst.ssh_target()
    return {**info, "status": INSTALLED, "ssh": {"hostname": target.hostname, "port": target.port,
                                                  "username": target.username, "host_key": target.host_key}}


def grant_for(job: Job, run: Run, user, actor: str, key: str, ports: list[int], shell: bool = False) -> AttachGrant:
    """The grant row, due for its install, with the install's message sent after commit; written
    only while the job is attachable: the job's row lock orders this against the job's end
    (engine/finishing.py), which marks every grant of the job due after its status has left
    ATTACHABLE (and the install step looks at the job again)."""
    from engine import messages

    with transaction.atomic():
        locked = Job.objects.select_for_update().get(pk=job.pk)
        if locked.status not in ATTACHABLE:
            raise InvalidInput(["job"], f"job {job.job_num} of run {run.name} is {locked.status}: "
                               f"{'ssh' if shell else 'attach'} once it is running")
        user = user if getattr(user, "pk", None) else None
        grant = AttachGrant.objects.create(job=job, instance_id=job.instance_id, project_id=run.project_id, user=user,
                                           install_due=True, public_key=key, ports=ports, shell=shell)
        grant.marker = marker(job.pk, grant.pk, getattr(user, "username", "") or actor)
        grant.save(update_fields=["marker"])
        messages.install_attach_key(grant.pk)
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
