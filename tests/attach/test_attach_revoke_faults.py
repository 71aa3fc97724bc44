"""The removal of a member's attach lines (the revoke_attach_keys step) survives its message
delivered twice and its first message lost (the sweep sends it again): each line goes, once, and
nothing else in the host's authorized_keys. Real sshd host, real worker (two threads)."""

from __future__ import annotations

import threading

import pytest

from engine import attach_revokes
from runs.models import AttachGrant, Run
from runs.services.submission import submit_run
from tests.attach.conftest import ROUTER, attach_installed
from tests.attach.test_attach_key_limits import openssh_key
from tests.attach.test_attach_revocation import key_accepted, lose_access
from tests.conftest import client_for
from tests.engine.faults import celery_worker_parameters, celery_worker_pool, inject  # noqa: F401
from tests.engine.helpers import Beat
from tests.ssh_e2e.helpers import needs_netns
from tests.waiting import wait_until

pytestmark = [*needs_netns, pytest.mark.django_db(transaction=True), pytest.mark.slow]


class Removals:
    """Records which grants each call of attach_revokes.remove_grants took off the host (and lets
    the real removal run), so "once" is counted where the lines are edited."""

    def __init__(self, real):
        self.real, self.removed, self.lock = real, [], threading.Lock()

    def __call__(self, host, grants, token=None):
        self.real(host, grants, token)
        with self.lock:
            self.removed.extend(g.pk for g in grants)


@pytest.mark.parametrize("mode", ["twice", "drop"])
def test_a_members_attach_lines_are_each_removed_once_when_the_revoke_message_is_duplicated_or_lost(
        mode, pool, make_user, project, celery_worker, tmp_path, monkeypatch):
    submit_run(project, None, {"configuration": ROUTER})
    wait_until(lambda: Run.objects.get(name="routed").current_jobs().filter(status="running").exists(),
               timeout=60, what="the router running")
    writer = client_for(make_user("writer"))
    keys = []
    for k in range(2):  # two keys of one member on one host: one step removes both lines
        (tmp_path / f"k{k}").mkdir()
        key, public = openssh_key(tmp_path / f"k{k}")
        attach_installed(writer, public)
        keys.append(key)
    lines = pool.authorized_keys.read_text().splitlines()
    others = [line for line in lines if "muster-attach-" not in line]
    assert len(lines) - len(others) == 2, "both attach lines installed"
    grants = sorted(AttachGrant.objects.values_list("pk", flat=True))
    removals = Removals(attach_revokes.remove_grants)
    monkeypatch.setattr(attach_revokes, "remove_grants", removals)
    faulty = inject(monkeypatch, "revoke_attach_keys", mode)

    with Beat(interval=0.3):
        lose_access("membership")
        wait_until(lambda: not AttachGrant.objects.exists(), 20, "the grants removed with their lines")

    if mode == "drop":
        assert faulty.dropped == 1 and faulty.sent >= 2, "the first message was lost and the sweep sent another"
    else:
        assert faulty.doubled >= 1, "the message was delivered twice"
    assert sorted(removals.removed) == grants, "each line taken off once"
    assert pool.authorized_keys.read_text().splitlines() == others, "only the attach lines went"
    for key in keys:
        assert key_accepted(pool, key) is False
    assert Run.objects.get(name="routed").current_jobs().get().status == "running"  # the job goes on
