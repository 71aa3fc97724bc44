"""A fleet's deletion (the delete_fleet step) survives its message delivered twice and its first
message lost: the fleet goes once, its hosts are terminated once and their runner agents stopped."""

from __future__ import annotations

from pathlib import Path

import pytest

from events.models import Event
from instances.models import Fleet, Instance
from runs.services.submission import submit_run
from tests.engine.faults import celery_worker_parameters, celery_worker_pool, inject  # noqa: F401
from tests.engine.helpers import Beat, job_summary, local_project_fleet, wait_for_run
from tests.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

TWO_NODES = "type: task\nname: before-delete\nnodes: 2\ncommands:\n  - echo rank $DSTACK_NODE_RANK\n"


def _agent_pids(local_dir: Path) -> list[int]:
    """The runner agents of the local hosts that are alive (their pid file names a live muster_runner)."""
    alive = []
    for pid_file in local_dir.glob("*/muster/agent.pid"):
        try:
            pid = int(pid_file.read_text().strip())
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"muster_runner" in f.read():
                    alive.append(pid)
        except (OSError, ValueError):
            continue
    return alive


@pytest.mark.parametrize("mode", ["twice", "drop"])
def test_a_fleet_deleted_through_the_api_goes_once_when_its_message_is_duplicated_or_lost(
        mode, fast_limits, superuser_api, celery_worker, monkeypatch, settings):
    fleet = local_project_fleet(size=2)
    hosts = list(fleet.instances.values_list("pk", flat=True))
    with Beat(interval=0.3):
        run = wait_for_run(submit_run(fleet.project, None, {"configuration": TWO_NODES}).name, timeout=60)
        assert run.status == "done", job_summary(run)
        local_dir = Path(settings.MUSTER["LOCAL_DIR"])
        assert len(_agent_pids(local_dir)) == 2, "each host's agent runs before the delete"
        faulty = inject(monkeypatch, "delete_fleet", mode)

        response = superuser_api.delete(f"/api/projects/main/fleets/{fleet.name}/")

        assert response.status_code == 202, response.content
        assert response.json()["status"] == "terminating"
        wait_until(lambda: not Fleet.objects.filter(pk=fleet.pk).exists(), 20, "the fleet removed")
        wait_until(lambda: not _agent_pids(local_dir), 20, "the hosts' runner agents stopped")
    if mode == "drop":
        assert faulty.dropped == 1 and faulty.sent >= 2, "the first message was lost and the sweep sent another"
    else:
        assert faulty.doubled >= 1, "the message was delivered twice"
    assert set(Instance.objects.filter(pk__in=hosts).values_list("status", flat=True)) == {"terminated"}
    ended = Event.objects.filter(instance_id__in=hosts, message__startswith="terminated with its fleet")
    assert sorted(ended.values_list("instance_id", flat=True)) == sorted(hosts), "each host terminated once"
    assert Event.objects.filter(subject=f"fleet {fleet.name}", message="deleted").count() == 1
