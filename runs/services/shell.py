"""`muster ssh`: a user's key on a job's host that runs commands in the job's environment.

The same grant rows, install and removal as attach's (runs/services/attach.py): the CLI sends the
user's public key, the request writes an AttachGrant with `shell` set and answers 202, a worker
puts the line on the host (engine/attach_installs.py), and it goes when the job ends or the user
loses access. Only the line differs: its forced command is the runner's `shell` (runner/shell.py),
which runs the session's command (or a login shell) in the job's container, or beside the job's
process with that process's environment, and nothing else. docs/cli.md has the design.
"""

from __future__ import annotations

from runs.models import Run
from runs.services.attach import INSTALLING, grant_for, parse_public_key, reached_over_ssh, running_job


def shell(run: Run, job_num: int, public_key: object, actor: str = "server", user=None) -> dict:
    """The shell grant for job `job_num`, which a worker installs on the job's host."""
    key = parse_public_key(public_key)
    job = running_job(run, job_num, "ssh")
    inst = job.instance
    # a local host has no login to put a key in (its jobs are on the server's own machine)
    reached_over_ssh(job, "ssh")
    grant = grant_for(job, run, user, actor, key, [], shell=True)
    return {"id": grant.pk, "status": INSTALLING, "job": job_num, "backend": inst.backend, "ip": inst.internal_ip,
            "shell": True, "node_group_name": job.node_group_name, "node_group_rank": job.node_group_rank}
