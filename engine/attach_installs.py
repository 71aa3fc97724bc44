"""Installing attach lines on hosts, as a claimed step (`install_attach_key`).

`POST runs/X/attach` (runs/services/attach.py) checks the key and the job, writes the grant row
`install_due` with the key and the job's ports, sends `messages.install_attach_key` and answers
202 without touching the host; `muster attach` polls the grant until it is installed. This step
claims the grant, puts its line into the host's authorized_keys, and gives the grant back with
`install_due` cleared. A host that does not answer leaves the grant due with a backoff and the
reason (`install_error`, which the CLI shows while it waits); the sweep sends the step again once
the backoff is over and the host's health check has it reachable (engine/sweeps.py), as it does
for a lost message. Installing twice is harmless: the host script appends a line only if absent.

The race with the job's end (or its user losing access): a grant marked `revoke_due` is not
claimed here, and its line, if an earlier try left one, goes with the grant
(engine/attach_revokes.py). Once the line is in, the grant is looked at again: a revoke that marked
it (or even removed its row) before the line landed found no line to remove, so the line goes here.
"""

from __future__ import annotations

import ipaddress
import logging
from functools import partial

from backends.base import BackendError
from backends.registry import attach_keys as attach_keys_module
from backends.registry import compute_for_instance
from engine import claims, messages, outcome
from engine.tuning import SWEEP_BATCH
from instances.models import Instance
from runs.choices import JOB_ATTACHABLE
from runs.models import AttachGrant

log = logging.getLogger(__name__)

ATTACH_EVENT = "attach key installed"

attach_keys = attach_keys_module()  # the SSH hosts' authorized_keys lines


def install_attach_key(grant_id: int) -> bool:
    """Task body: install a due grant's line on its host; True when it is installed by this call."""
    held = claims.claimed(AttachGrant, grant_id, "install_attach_key", _install,
                          install_due=True, revoke_due=False)
    return held is not None and grant_id in held.applied and held.outcome.fields.get("install_due") is False \
        and not held.outcome.fields.get("revoke_due")


def key_line(grant: AttachGrant, ip: str, host) -> str:
    """`restrict` with no forwarding at all, and a forced command that carries one connection to
    one of the job's ports over the session itself (the runner's `forward`). A `port-forwarding`
    key cannot be held to the job's ports: `permitopen` leaves -R open, `permitlisten` bounds TCP
    listeners only, and OpenSSH (9.2 here) lets any Unix-socket -R or -L through whatever the lists
    say. docs/cli.md has the design."""
    keys = attach_keys.path_expr(attach_keys.authorized_keys_path())
    if grant.shell:
        # a shell key (`muster ssh`): still no forwarding of any kind, but a terminal (`pty`) for
        # its one forced command, the runner's `shell` in the job's environment
        options, command = "restrict,pty", host.shell_command(grant.job.runner_job_id, keys, grant.marker)
    else:
        # the address comes from the host's own probe: only a plain IP goes into the command
        ip = str(ipaddress.ip_address(ip))
        options, command = "restrict", host.forward_command(ip, list(grant.ports), keys, grant.marker)
    # sshd's own quoting of a command="..." option: a double quote is written \"
    return f'{options},command="{command.replace(chr(34), chr(92) + chr(34))}" {grant.public_key} {grant.marker}'


def _install(held: claims.Held) -> claims.Outcome:
    grant = held.rows(AttachGrant.objects.select_related("job", "job__run", "instance", "instance__fleet",
                                                         "user")).first()
    if grant is None:
        return _GONE  # removed since the claim (the job ended): nothing was installed by this try
    job = grant.job
    if job is None or job.status not in JOB_ATTACHABLE or job.instance_id != grant.instance_id:
        # the job ended before its line went in (its end marks the grant due; a job deleted does
        # not): an earlier try may have left the line, so it goes with the grant, by the revoke step
        return claims.Outcome(fields={"install_due": False, "revoke_due": True},
                              then=(partial(messages.revoke_attach_keys, grant.instance_id),))
    inst = grant.instance
    host = compute_for_instance(inst).runner_host(inst)
    try:
        try:
            attach_keys.install(host, attach_keys.authorized_keys_path(), key_line(grant, inst.internal_ip, host))
        except BackendError as exc:
            # the line may be there (the answer was lost): the next try finds it and adds nothing
            log.info("attach key of grant %s not installed on %s: %s", grant.pk, inst.name, exc)
            return claims.Outcome(fields={"install_error": f"host {inst.name} did not take the key: {exc}"[:300]},
                                  retry_in=claims.backoff_seconds())
        _record_host_key(inst, host)
        if not AttachGrant.objects.filter(pk=grant.pk, revoke_due=False).exists():
            attach_keys.remove(host, attach_keys.authorized_keys_path(), [grant.needle])
            AttachGrant.objects.filter(pk=grant.pk).delete()
            return _GONE
    finally:
        host.close()
    actor = grant.user.username if grant.user else "server"
    what = ("a shell in the job's environment" if grant.shell
            else f"forwarding to {inst.internal_ip}:{','.join(map(str, grant.ports))}")
    said = outcome.event(grant.project_id, f"job {job.run.name}/{job.job_num}", f"{ATTACH_EVENT} on {inst.name} by "
                         f"{actor}: {what}", actor=actor, run_id=job.run_id, job_id=job.pk, instance_id=inst.pk)
    return claims.Outcome(fields={"install_due": False, "install_error": ""}, events=(said,))


def _record_host_key(inst, host) -> None:
    """The CLI checks the host key the server recorded. Hosts of an ssh fleet have theirs from
    registration; a TPU VM's is taken on the engine's first contact and kept nowhere, so the key
    this connection (the one the engine trusts for the job) saw is recorded here, once."""
    if not inst.host_key:
        seen = host.remote_host_key()
        Instance.objects.filter(pk=inst.pk, host_key="").update(host_key=seen)
        inst.host_key = seen


# the grant went away under the step (its job ended): given back as it is, nothing to say
_GONE = claims.Outcome()


def grants_due(now, old):
    """Grants whose line is still to go onto a reachable host and that nobody is installing: a lost
    message, or a try that backed off (for the sweep). Written before `old`: a new grant's own
    message is not lost, only on its way."""
    return (AttachGrant.objects.filter(claims.unleased(now), install_due=True, revoke_due=False,
                                       instance__unreachable=False, created__lt=old)
            .order_by("pk").values_list("pk", flat=True)[:SWEEP_BATCH])
