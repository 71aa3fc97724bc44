"""A slice Google takes back while a run uses it (spot preemption, end of life, a slice that is gone,
a queued resource suspended, maintenance past its grace): noticed from the TPU API within one
watch tick, every job of the group ends as an interruption, the slice is deleted, and `retry` on
`interruption` brings a new slice that finishes the run. The hosts stay reachable over SSH the
whole time, as a preempted VM's may for a while: only the TPU API says the slice is gone."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest
import yaml

from instances.models import LIVE_INSTANCE_STATUSES as LIVE
from instances.models import Instance, InstanceGroup
from runs.models import Job
from tests.conftest import example
from tests.engine.helpers import wait_for_run
from tests.tpu_e2e.helpers import ZONES, needs_netns, tpu_task
from tests.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.netns, pytest.mark.slow, needs_netns]

WATCH_INTERVAL = 0.5


@pytest.fixture
def pod_watch(gcp, settings) -> Iterator[None]:
    """What beat sends besides the sweep: engine.tasks.watch_pods every POD_POLL_INTERVAL."""
    from engine import tasks

    settings.MUSTER = {**settings.MUSTER, "POD_POLL_INTERVAL": WATCH_INTERVAL,
                       "UNREACHABLE_GRACE": 300}  # the SSH path cannot be what notices
    stop = threading.Event()

    watch = getattr(tasks, "watch_pods", None)  # (absent before pods were watched: nothing to send)

    def tick() -> None:
        while watch is not None and not stop.wait(WATCH_INTERVAL):
            watch.delay()

    thread = threading.Thread(target=tick, name="pod-watch-ticks", daemon=True)
    thread.start()
    yield
    stop.set()
    thread.join(5)


def node(zone: str, pod: str) -> str:
    return f"projects/test-project/locations/{zone}/nodes/{pod}"


def request(zone: str, pod: str) -> str:
    return f"projects/test-project/locations/{zone}/queuedResources/{pod}"


def long_first_time(name: str, **changes) -> dict:
    """A v4-16 task whose first submission runs long and whose later ones finish at once."""
    mark = f"/tmp/muster-preempt-{uuid.uuid4().hex[:8]}"
    command = f'if [ -e {mark}-$DSTACK_NODE_RANK ]; then echo again; else touch {mark}-$DSTACK_NODE_RANK; sleep 120; fi'
    return tpu_task(name, "v4-16", commands=[command], **changes)


def lists_since(gcp, mark: int) -> int:
    return sum(1 for method, path in gcp.calls[mark:] if method == "GET" and path.endswith("/nodes"))


def preempt_when_running(gcp, run_name: str, take) -> tuple[InstanceGroup, float, int]:
    wait_until(lambda: Job.objects.filter(run__name=run_name, status="running").count() == 2, 60,
               "both jobs running on the slice")
    pod = InstanceGroup.objects.get(kind="tpu_pod", status="active")
    mark = len(gcp.calls)
    take(pod)
    return pod, time.monotonic(), mark


def noticed(gcp, run_name: str, started: float, mark: int) -> tuple[float, int]:
    wait_until(lambda: Job.objects.filter(run__name=run_name, submission_num=0,
                                          termination_reason="interrupted_by_no_capacity").exists(), 30,
               "the jobs ended as an interruption")
    return time.monotonic() - started, lists_since(gcp, mark)


def test_a_preempted_queued_spot_slice_ends_its_jobs_as_an_interruption_within_one_tick_and_retry_reruns_it(
        gcp, api, submit, celery_worker, beat, pod_watch):
    gcp.queued_script[ZONES[0]] = ["CREATING", "ACTIVE"]
    conf = yaml.safe_load(example("tpu-queued-spot-fleet.yml"))
    assert api.post("/api/projects/main/fleets/", {"configuration": conf}, format="json").status_code == 201
    name = submit(long_first_time("preempted", fleets=["tpu-queued"],
                                  retry={"on_events": ["interruption"], "duration": "10m"}))

    first, started, mark = preempt_when_running(gcp, name, lambda pod: gcp.preempt(node(ZONES[0], pod.name)))
    took, lists = noticed(gcp, name, started, mark)

    assert lists <= 2, f"noticed after {lists} lists of the zone's nodes: not within one watch tick"
    ended = list(Job.objects.filter(run__name=name, submission_num=0))
    assert {j.termination_reason for j in ended} == {"interrupted_by_no_capacity"}, "every job of the group"
    assert all("queued resource" in j.termination_message and "SUSPENDED" in j.termination_message for j in ended)
    run = wait_for_run(name, timeout=120)
    assert run.status == "done" and run.submission_num == 1, (run.status, run.termination_reason)
    second = InstanceGroup.objects.exclude(pk=first.pk).get(kind="tpu_pod")
    assert (request(ZONES[0], first.name), True) in gcp.queued_delete_calls, "the suspended request deleted with force"
    assert list(gcp.queued) == [request(ZONES[0], second.name)]
    first.refresh_from_db()
    assert first.status == "terminated"
    assert not Instance.objects.filter(group=first).exclude(status="terminated").exists()
    print(f"preemption noticed in {took:.2f}s, {lists} list call(s) after it")


@pytest.mark.parametrize("loss", ["PREEMPTED", "TERMINATED", "gone", "UNHEALTHY_MAINTENANCE"])
def test_a_running_slice_taken_back_ends_every_job_as_an_interruption_and_is_deleted(
        gcp, make_fleet, submit, settings, celery_worker, pod_watch, loss):
    settings.MUSTER = {**settings.MUSTER, "TPU_MAINTENANCE_GRACE": 1}
    make_fleet(spot=True)
    name = submit(long_first_time(f"lost-{loss.lower().split('_')[-1]}"))

    def take(pod):
        if loss == "gone":
            gcp.vanish(node(ZONES[0], pod.name))
        elif loss == "UNHEALTHY_MAINTENANCE":
            gcp.set_health(node(ZONES[0], pod.name), loss)
        else:
            gcp.set_state(node(ZONES[0], pod.name), loss)

    pod, started, mark = preempt_when_running(gcp, name, take)
    took, lists = noticed(gcp, name, started, mark)
    run = wait_for_run(name, timeout=60)

    if loss != "UNHEALTHY_MAINTENANCE":  # (that one waits out its grace first)
        assert lists <= 2, f"noticed after {lists} lists of the zone's nodes"
    assert run.status == "failed"
    assert {j.termination_reason for j in run.current_jobs()} == {"interrupted_by_no_capacity"}
    wait_until(lambda: InstanceGroup.objects.get(pk=pod.pk).status == "terminated", 20, "the pod deleted")
    assert gcp.nodes == {}
    assert not Instance.objects.filter(status__in=LIVE).exists(), "no host left busy or idle"
    print(f"{loss} noticed in {took:.2f}s")


def test_a_slice_preempted_while_being_created_is_an_interruption_not_an_executor_error(
        gcp, make_fleet, submit, celery_worker):
    gcp.stuck_creating = True
    make_fleet(spot=True)
    name = submit(tpu_task("preempted-creating", "v4-16"))
    wait_until(lambda: gcp.create_calls, 30, "the create call")
    gcp.set_state(gcp.create_calls[0], "PREEMPTED")

    run = wait_for_run(name, timeout=60)

    reasons = {j.termination_reason for j in run.current_jobs()}
    assert "interrupted_by_no_capacity" in reasons and "executor_error" not in reasons, reasons
    wait_until(lambda: gcp.nodes == {}, 20, "the preempted slice deleted")
