"""A service's replicas through the REST API with a real worker on local hosts: placed one by one,
replaced when one dies, out of the pool while its probe fails, drained at a stop."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from events.models import Event
from instances.models import Instance
from runs.models import Job, Run
from tests.engine.helpers import Beat, wait_for_run
from tests.engine.service_helpers import (
    apply_service,
    describe,
    local_fleet,
    ready,
    replicas,
    service_yaml,
    wait_until,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def two_hosts(fast_limits):
    fleet, end = local_fleet(2)
    yield fleet
    end()


def test_two_replicas_are_placed_one_host_each_and_a_third_waits_for_a_host(two_hosts, celery_worker, api, tmp_path):
    retry = "retry:\n  on_events: [no-capacity]\n  duration: 1h\n"
    apply_service(api, service_yaml("web", tmp_path, replicas="3", extra=retry))
    wait_until(lambda: len(ready("web")) == 2, 60, "two replicas ready")
    jobs = replicas("web")
    placed = [j for j in jobs if j.instance_id]
    assert len({j.instance_id for j in placed}) == 2, describe("web")
    waiting = [j for j in jobs if not j.instance_id]
    assert len(waiting) == 1 and waiting[0].status == "submitted" and "fleet local is full" in waiting[0].waiting_for, \
        describe("web")
    assert Run.objects.get(name="web").status == "running"


def test_a_killed_replica_is_replaced_while_the_other_keeps_serving(two_hosts, celery_worker, api, tmp_path):
    retry = "retry:\n  on_events: [error, interruption]\n  duration: 1h\n"
    apply_service(api, service_yaml("web", tmp_path, extra=retry))
    first = wait_until(lambda: (r := ready("web")) and len(r) == 2 and r, 60, "two replicas ready")
    victim, other = first
    pid = int((Path(tmp_path) / victim.instance.internal_ip / "pid").read_text())
    os.kill(pid, signal.SIGKILL)
    # the other replica serves throughout; the killed one comes back as a new submission of itself
    with Beat():
        def back():
            now = ready("web")
            assert other.pk in {j.pk for j in now} or Job.objects.get(pk=other.pk).status == "running", describe("web")
            return len(now) == 2 and any(j.replica_num == victim.replica_num and j.submission_num > victim.submission_num
                                         for j in now)
        wait_until(back, 60, "the killed replica replaced and ready again")
    assert Job.objects.get(pk=other.pk).status == "running" and Job.objects.get(pk=other.pk).submission_num == \
        other.submission_num
    old = Job.objects.get(pk=victim.pk)
    assert old.superseded and old.termination_reason in ("process_exited_with_error", "executor_error"), old
    assert Run.objects.get(name="web").status == "running"


def test_a_replica_whose_probe_fails_leaves_the_ready_set_and_comes_back(two_hosts, celery_worker, api, tmp_path):
    apply_service(api, service_yaml("web", tmp_path))
    first = wait_until(lambda: (r := ready("web")) and len(r) == 2 and r, 60, "two replicas ready")
    sick = first[0]
    ok = Path(tmp_path) / sick.instance.internal_ip / "ok"
    ok.unlink()
    wait_until(lambda: [j.pk for j in ready("web")] == [first[1].pk], 30, "the sick replica out of the pool")
    assert Job.objects.get(pk=sick.pk).status == "running", "out of the pool, not ended"
    ok.write_text("ok\n")
    wait_until(lambda: len(ready("web")) == 2, 30, "the replica back in the pool")
    assert Job.objects.get(pk=sick.pk).submission_num == sick.submission_num, "the same replica, not a new one"


def test_a_stop_takes_the_replicas_out_of_the_pool_then_stops_them_and_ends_terminated(two_hosts, celery_worker, api,
                                                                                      tmp_path):
    apply_service(api, service_yaml("web", tmp_path))
    wait_until(lambda: len(ready("web")) == 2, 60, "two replicas ready")
    assert api.post("/api/projects/main/runs/web/stop", {}, format="json").status_code in (200, 202)
    run = wait_for_run("web", timeout=60)
    assert run.status == "terminated", describe("web")
    assert not ready("web") and all(j.finished for j in replicas("web"))
    assert not Instance.objects.filter(status="busy").exists()
    for job in replicas("web"):  # out of the endpoint's pool first, in the stop's transaction, then stopped
        said = list(Event.objects.filter(job_id=job.pk).order_by("id").values_list("message", flat=True))
        out = said.index("out of the endpoint's pool: the service stops")
        assert out < next(i for i, m in enumerate(said) if m.startswith("terminating")), said


def test_without_retry_a_failed_replica_fails_the_service_as_dstack_does(two_hosts, celery_worker, api, tmp_path):
    apply_service(api, service_yaml("web", tmp_path))
    victim = wait_until(lambda: (r := ready("web")) and len(r) == 2 and r[0], 60, "two replicas ready")
    os.kill(int((Path(tmp_path) / victim.instance.internal_ip / "pid").read_text()), signal.SIGKILL)
    run = wait_for_run("web", timeout=60)
    assert (run.status, run.termination_reason) == ("failed", "job_failed"), describe("web")
    assert not Instance.objects.filter(status="busy").exists()
