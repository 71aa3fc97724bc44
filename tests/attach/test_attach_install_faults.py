"""The install of an attach line (the install_attach_key step) is the worker's, not the request's:
`POST runs/X/attach` answers 202 while the host is down and the line goes in once it answers; the
step survives its message delivered twice and its first message lost (the sweep sends it again),
and the line is in once. Real sshd host, real worker (two threads)."""

from __future__ import annotations

import time

import pytest

from runs.models import AttachGrant, Run
from runs.services.submission import submit_run
from tests.attach.conftest import ROUTER, attach_installed
from tests.attach.test_attach_key_limits import openssh_key
from tests.attach.test_attach_revocation import key_accepted
from tests.conftest import client_for
from tests.engine.faults import celery_worker_parameters, celery_worker_pool, inject  # noqa: F401
from tests.engine.helpers import Beat
from tests.ssh_e2e.helpers import needs_netns
from tests.waiting import wait_until

pytestmark = [*needs_netns, pytest.mark.django_db(transaction=True), pytest.mark.slow]


def attach_lines(pool) -> list[str]:
    return [line for line in pool.authorized_keys.read_text().splitlines() if "muster-attach-" in line]


def routed(project) -> None:
    submit_run(project, None, {"configuration": ROUTER})
    wait_until(lambda: Run.objects.get(name="routed").current_jobs().filter(status="running").exists(),
               timeout=90, what="the router running")


def test_the_attach_request_answers_while_the_host_is_down_and_the_key_goes_in_once_it_answers(
        pool, make_user, project, celery_worker, tmp_path):
    routed(project)
    key, public = openssh_key(tmp_path)
    writer = client_for(make_user("writer"))
    host = pool[0]
    host.stop_sshd()
    try:
        started = time.monotonic()
        answer = writer.post("/api/projects/main/runs/routed/attach", {"job": 0, "public_key": public}, format="json")
        assert answer.status_code == 202, answer.content
        assert time.monotonic() - started < 3, "the request did not wait for the host"
        status = f"/api/projects/main/runs/routed/attach/{answer.json()['id']}"
        # the worker's try finds no host: the grant waits with the reason, and no line is there
        wait_until(lambda: writer.get(status).json().get("error"), timeout=60, what="the install's failed try")
        assert writer.get(status).json()["status"] == "installing"
        assert attach_lines(pool) == []
    finally:
        host.start_sshd()
    with Beat(interval=0.5):
        wait_until(lambda: writer.get(status).json()["status"] == "installed", timeout=120,
                   what="the sweep's install once the host answers")
    assert len(attach_lines(pool)) == 1
    assert wait_until(lambda: key_accepted(pool, key), timeout=60, what="the key accepted")


@pytest.mark.parametrize("mode", ["twice", "drop"])
def test_an_attach_line_is_installed_once_when_the_install_message_is_duplicated_or_lost(
        mode, pool, make_user, project, celery_worker, tmp_path, monkeypatch):
    routed(project)
    _, public = openssh_key(tmp_path)
    writer = client_for(make_user("writer"))
    faulty = inject(monkeypatch, "install_attach_key", mode)
    with Beat(interval=0.3):
        attach_installed(writer, public, timeout=60)
    if mode == "drop":
        assert faulty.dropped == 1 and faulty.sent >= 2, "the first message was lost and the sweep sent another"
    else:
        assert faulty.doubled >= 1, "the message was delivered twice"
    assert len(attach_lines(pool)) == 1, "the line is in once"
    assert AttachGrant.objects.get().install_due is False
