"""`on_slice_failure: replace-slice` end to end: a multislice set of v4-16 slices (2 hosts each)
through the API, the real worker and beat, the real google-cloud-tpu client against the fake, and
namespace sshd hosts. One slice is preempted while every job runs: the other slices are never
deleted (their nodes keep their names and their hosts their jobs' addresses), one new slice is
created in the kept slices' zone, and every job of the set runs again, with the coordinator at
slice 0 worker 0 whichever slice that now is. The hosts stay reachable the whole time: only the
TPU API says the slice is gone."""

from __future__ import annotations

import itertools
import time

import pytest

from instances.models import InstanceGroup
from runs.models import Job
from runs.services import logs
from tests.engine.helpers import wait_for_run
from tests.tpu_e2e.helpers import ZONES, env_line, needs_netns
from tests.tpu_e2e.test_multislice import PRINT_MEGASCALE, megascale, node
from tests.tpu_e2e.test_pod_preemption import long_first_time, pod_watch  # noqa: F401 - fixture
from tests.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.netns, pytest.mark.slow, needs_netns]


@pytest.fixture(scope="module")
def tpu_hosts(ssh_hosts_session):
    """Eight hosts: three slices of two, and two for the slice that replaces a lost one."""
    return ssh_hosts_session(8, mode="netns")


@pytest.fixture
def in_creation_order(gcp):
    """Each new node gets the next two hosts, in the order the nodes were asked for (a replacement
    slice therefore gets hosts no slice of the set had: Google gives new VMs new addresses)."""
    addresses = [str(a) for a in gcp.host_addresses]

    def place(node_id: str, hosts: int) -> list[str]:
        ids = list(dict.fromkeys(name.rsplit("/", 1)[1] for name in gcp.create_calls))
        k = ids.index(node_id)
        return addresses[k * hosts:(k + 1) * hosts]

    gcp.host_addresses = place
    return addresses


def replace_slice_task(name: str, slices: int) -> dict:
    conf = long_first_time(name, slices=slices, on_slice_failure="replace-slice")
    conf["commands"] = [PRINT_MEGASCALE, *conf["commands"], (
        'echo "rank=$DSTACK_NODE_RANK worker=$TPU_WORKER_ID ip=$DSTACK_NODE_IP nodes=$DSTACK_NODES_NUM '
        'hostnames=$TPU_WORKER_HOSTNAMES"')]
    return conf


def running_set(name: str, jobs: int) -> InstanceGroup:
    wait_until(lambda: Job.objects.filter(run__name=name, status="running").count() == jobs, 120,
               f"the {jobs} jobs running on the set")
    return InstanceGroup.objects.get(kind="tpu_pod", status="active")


def test_a_lost_slice_is_replaced_alone_and_the_kept_slices_are_never_deleted(
        gcp, in_creation_order, make_fleet, submit, celery_worker, beat, pod_watch):  # noqa: F811
    make_fleet(spot=True)
    name = submit(replace_slice_task("ms-replace", 3))
    pod = running_set(name, 6)
    kept = {j.job_num: (j.instance_id, j.instance.internal_ip)
            for j in Job.objects.filter(run__name=name).select_related("instance") if j.job_num not in (2, 3)}
    slices = [node(ZONES[0], f"{pod.name}-s-{i}") for i in range(3)]
    assert gcp.create_calls == slices

    gcp.set_state(slices[1], "PREEMPTED")
    lost_at = time.monotonic()

    run = wait_for_run(name, timeout=150)
    jobs = sorted(run.current_jobs().select_related("instance"), key=lambda j: j.job_num)
    assert run.status == "done", [(j.job_num, j.status, j.termination_reason, j.termination_message) for j in jobs]
    print(f"set running again and done {time.monotonic() - lost_at:.1f}s after the preemption")
    first = list(Job.objects.filter(run__name=name, submission_num=0))
    assert {j.termination_reason for j in first} == {"interrupted_by_no_capacity"}, "every job of the set stopped"
    assert all("slice 1 of 3 lost" in j.termination_message for j in first), [j.termination_message for j in first]
    [new] = gcp.create_calls[3:]
    assert new.startswith(f"projects/test-project/locations/{ZONES[0]}/nodes/") and new.endswith("-s-1"), new
    assert slices[0] not in gcp.delete_calls and slices[2] not in gcp.delete_calls, "kept slices never deleted"
    assert gcp.delete_calls == [slices[1]], "only the lost slice deleted"
    assert sorted(gcp.nodes) == sorted([slices[0], slices[2], new]), "slices 0 and 2 keep their names"
    assert InstanceGroup.objects.filter(kind="tpu_pod").count() == 1, "the same pod, not a new set"
    assert [j.submission_num for j in jobs] == [1] * 6, "every job of the set ran again"
    for job in jobs:
        text = logs.read(job).decode()
        seen, ms = env_line(text), megascale(text)
        assert "again" in text
        assert ms == {"slices": "3", "slice": str(job.job_num // 2), "coordinator": f"{in_creation_order[0]}:8081"}
        if job.job_num in kept:
            assert (job.instance_id, seen["ip"]) == kept[job.job_num], "kept slices restart on the same hosts"
        else:
            assert seen["ip"] == in_creation_order[6 + job.job_num - 2], "the lost slice's ranks on the new slice"
            assert seen["hostnames"] == ",".join(in_creation_order[6:8])
    events = " | ".join(api_events(run))
    assert "replacing it (on_slice_failure: replace-slice)" in events, events


def api_events(run) -> list[str]:
    from events.models import Event

    return list(Event.objects.filter(project_id=run.project_id).values_list("message", flat=True))


def test_losing_slice_0_moves_the_coordinator_to_the_new_slice_even_when_the_create_answer_is_lost(
        gcp, in_creation_order, make_fleet, submit, celery_worker, beat, pod_watch):  # noqa: F811
    make_fleet(spot=True)
    name = submit(replace_slice_task("ms-coordinator", 2))
    pod = running_set(name, 4)
    slices = [node(ZONES[0], f"{pod.name}-s-{i}") for i in range(2)]

    gcp.lost_answers["create"] = 1  # the replacement's create is made, its answer never arrives
    gcp.set_state(slices[0], "PREEMPTED")

    run = wait_for_run(name, timeout=150)
    jobs = sorted(run.current_jobs().select_related("instance"), key=lambda j: j.job_num)
    assert run.status == "done", [(j.job_num, j.status, j.termination_reason, j.termination_message) for j in jobs]
    new = {c for c in gcp.create_calls[2:]}
    assert len(new) == 1 and next(iter(new)).endswith("-s-0"), gcp.create_calls
    assert sorted(gcp.nodes) == sorted([*new, slices[1]]), "one replacement, adopted after its lost answer"
    moved = f"{in_creation_order[4]}:8081"  # the new slice 0's worker 0
    for job in jobs:
        assert megascale(logs.read(job).decode())["coordinator"] == moved, job.job_num


def test_a_replacement_with_no_capacity_in_the_sets_zone_is_asked_again_then_ends_the_run_as_today(
        gcp, in_creation_order, make_fleet, submit, celery_worker, beat, pod_watch):  # noqa: F811
    from http import HTTPStatus

    from instances.models import LIVE_INSTANCE_STATUSES as LIVE
    from instances.models import Instance

    make_fleet(spot=True)
    conf = {**replace_slice_task("ms-stockout", 2), "retry": {"on_events": ["interruption"], "duration": "3s"}}
    name = submit(conf)
    pod = running_set(name, 4)
    slices = [node(ZONES[0], f"{pod.name}-s-{i}") for i in range(2)]

    gcp.node_create_errors["-s-1"] = (HTTPStatus.TOO_MANY_REQUESTS, "There is no more capacity in the zone")
    gcp.set_state(slices[1], "PREEMPTED")

    run = wait_for_run(name, timeout=120)
    assert run.status == "failed", run.status
    reasons = {j.termination_reason for j in run.current_jobs()}
    assert "failed_to_start_due_to_no_capacity" in reasons, reasons
    # the replacement's creates (a whole new set may follow, whose first create is a `-s-0`)
    asked = list(itertools.takewhile(lambda c: not c.endswith("-s-0"), gcp.create_calls[2:]))
    assert len(asked) >= 2, f"asked again while retry.duration lasts: {gcp.create_calls}"
    assert all(c.startswith(node(ZONES[0], "")) for c in asked), f"only in the kept slice's zone: {asked}"
    wait_until(lambda: gcp.nodes == {}, 30, "no slice left billed")
    wait_until(lambda: not Instance.objects.filter(status__in=LIVE).exists(), 30, "no host left")


def test_a_queued_set_cannot_replace_one_slice_and_goes_whole_saying_why(
        gcp, api, submit, celery_worker, beat, pod_watch):  # noqa: F811
    import yaml

    from tests.conftest import example

    gcp.queued_script[ZONES[0]] = ["CREATING", "ACTIVE"]
    conf = yaml.safe_load(example("tpu-queued-spot-fleet.yml"))
    assert api.post("/api/projects/main/fleets/", {"configuration": conf}, format="json").status_code == 201
    name = submit({**replace_slice_task("ms-queued-replace", 2), "fleets": ["tpu-queued"]})
    pod = running_set(name, 4)

    gcp.preempt(node(ZONES[0], f"{pod.name}-s-1"))

    wait_until(lambda: Job.objects.filter(run__name=name, submission_num=0,
                                          termination_reason="interrupted_by_no_capacity").count() == 4, 60,
               "every job of the set ended as an interruption")
    [message] = set(Job.objects.filter(run__name=name, submission_num=0).values_list("termination_message", flat=True))
    assert "the whole set goes" in message and "a queued multislice request is filled and deleted whole" in message
    wait_until(lambda: InstanceGroup.objects.get(pk=pod.pk).status == "terminated", 30, "the whole set deleted")
