"""`muster ssh` against a real sshd host in a network namespace, a live server and a real worker:
one command in the job's environment (its env, its directory, its exit status), the shell key as
the host holds it, and the key gone when its member is removed; read-only members are refused."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

from projects.models import Membership
from runs.models import Run
from tests.attach.test_attach_key_limits import run, ssh
from tests.conftest import client_for, token_for
from tests.engine.helpers import wait_for_run
from tests.ssh_e2e.helpers import needs_netns
from tests.waiting import wait_until

pytestmark = [*needs_netns, pytest.mark.django_db(transaction=True), pytest.mark.slow]

MUSTER = [sys.executable, "-c", "import sys; from cli.main import main; sys.exit(main())"]

QUIET = """\
type: task
name: quiet
fleets: [hosts]
env:
  - GREETING=hello-from-the-job
commands:
  - echo ready > here.txt
  - sleep 600
"""


def muster(env, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MUSTER, *args], env=env, capture_output=True, text=True, timeout=180,
                          stdin=subprocess.DEVNULL, cwd=Path(__file__).resolve().parents[2])


def interactive(env, typed: bytes) -> tuple[int, bool]:
    """`muster ssh quiet` on a terminal (a pty of our own), `typed` sent once the shell prompts:
    its exit status, and whether the job's env answered."""
    parent, child = pty.openpty()
    proc = subprocess.Popen([*MUSTER, "ssh", "quiet"], env=env, stdin=child, stdout=child, stderr=child,
                            cwd=Path(__file__).resolve().parents[2])
    os.close(child)
    seen = bytearray()

    def read() -> None:
        while True:
            try:
                chunk = os.read(parent, 4096)
            except OSError:
                return
            if not chunk:
                return
            seen.extend(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        # after the CLI's line saying where it is, the remote shell's prompt ("$ " or "# ")
        wait_until(lambda: re.search(rb"OpenSSH.*[#$] ?$", bytes(seen), re.S), timeout=60, what="the prompt")
        os.write(parent, typed)
        code = proc.wait(30)
        reader.join(5)
        return code, b"[hello-from-the-job]" in seen
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(parent)


def shell_lines(pool) -> list[str]:
    return [line for line in pool.authorized_keys.read_text().splitlines() if "muster-attach-" in line]


def sleeps() -> list[str]:
    return subprocess.run(["pgrep", "-af", "^sleep 100[123]$"], capture_output=True, text=True).stdout.splitlines()


def argv_holding(text: bytes, besides: int) -> list[int]:
    """Processes (but `besides` and its children: the client, which was given the text) whose
    arguments hold `text`."""
    found = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
            parent = int(Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if text in cmdline and besides not in (int(name), parent):
            found.append(int(name))
    return found


def running(name: str) -> bool:
    return Run.objects.filter(name=name, jobs__status="running").exists()


def test_muster_ssh_runs_a_command_in_the_jobs_env_and_the_key_goes_with_the_member(pool, cli_env, celery_worker,
                                                                                     tmp_path):
    task = tmp_path / "quiet.yml"
    task.write_text(QUIET)
    assert muster(cli_env, "apply", "-f", str(task), "-y", "-d").returncode == 0
    wait_until(lambda: running("quiet"), timeout=90, what="the job running")

    done = muster(cli_env, "ssh", "quiet", "--", 'echo "$GREETING on $DSTACK_NODE_IP in $(cat here.txt)"; exit 7')

    assert done.returncode == 7, done.stderr
    assert done.stdout == f"hello-from-the-job on {pool[0].address} in ready\n"
    [line] = shell_lines(pool)
    assert line.startswith('restrict,pty,command="') and " shell --job " in line
    key = Path(cli_env["HOME"]) / ".muster" / "attach_key"
    # the same key with OpenSSH: whatever command is asked runs as the job's shell, nothing else
    seen = run(ssh(pool, key, command="echo $GREETING"))
    assert (seen.returncode, seen.stdout) == (0, b"hello-from-the-job\n"), seen.stderr
    assert run(ssh(pool, key, "-N", "-L", "9999:127.0.0.1:22", command=None)).returncode != 0

    # an interactive shell on a terminal: what is typed runs in the job's environment
    assert interactive(cli_env, b'echo "[$GREETING]"; exit 3\n') == (3, True)
    # a shell open when the member goes is ended with the key, with all it started: a `setsid` and a
    # `nohup` child too (no terminal here); the command's text is in no process's arguments
    held = subprocess.Popen([*MUSTER, "ssh", "quiet", "--", "setsid sleep 1001 & nohup sleep 1002 >/dev/null 2>&1 & "
                             ": not-in-argv; echo open; sleep 1003"], env=cli_env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[2])
    try:
        assert held.stdout.readline() == "open\n"
        wait_until(lambda: len(sleeps()) == 3, timeout=10, what="the session's sleeps started")
        assert argv_holding(b"not-in-argv", besides=held.pid) == []
        Membership.objects.filter(user__username="bob").delete()
        wait_until(lambda: shell_lines(pool) == [], timeout=60, what="the shell key removed from the host")
        assert held.wait(30) != 0
        wait_until(lambda: sleeps() == [], timeout=15, what="the shell's processes ended")
    finally:
        held.kill()
        held.wait(10)
    refused = run(ssh(pool, key, command="echo $GREETING"))
    assert b"Permission denied" in refused.stderr and refused.stdout == b""
    again = muster(cli_env, "ssh", "quiet", "--", "true")
    assert again.returncode != 0 and "hello" not in again.stdout
    assert running("quiet")  # the run itself goes on: its member left, not its job


def test_muster_ssh_is_refused_to_read_only_members_and_the_key_goes_when_the_job_ends(pool, cli_env, make_user,
                                                                                       celery_worker, tmp_path):
    task = tmp_path / "quiet.yml"
    task.write_text(QUIET)
    assert muster(cli_env, "apply", "-f", str(task), "-y", "-d").returncode == 0
    wait_until(lambda: running("quiet"), timeout=90, what="the job running")

    reader = make_user("reader", role="read-only")
    public = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"
    denied = client_for(reader).post("/api/projects/main/runs/quiet/ssh", {"job": 0, "public_key": public},
                                     format="json")
    assert denied.status_code == 403
    as_reader = muster({**cli_env, "MUSTER_TOKEN": token_for(reader)}, "ssh", "quiet", "--", "true")
    assert as_reader.returncode != 0 and "is read-only" in as_reader.stderr
    assert shell_lines(pool) == []
    missing = client_for(get_user_model().objects.get(username="bob")).post(
        "/api/projects/main/runs/quiet/ssh", {"job": 5, "public_key": public}, format="json")
    assert missing.status_code == 400 and missing.json()["errors"][0]["loc"] == ["job"]

    assert muster(cli_env, "ssh", "quiet", "--", "true").returncode == 0
    assert len(shell_lines(pool)) == 1
    assert muster(cli_env, "stop", "quiet", "-y").returncode == 0
    assert wait_for_run("quiet", timeout=90).status == "terminated"
    assert shell_lines(pool) == []
