"""The run, group and pod steps as process -> outcome -> guarded apply, run in the test process on a
fake backend (no worker, no cloud): which rows a step takes, what it leaves and sends on success,
that a stale lease makes it drop its outcome, that it does nothing while another worker holds the
row, and what happens when the row moves under it (step_case marks: tests/test_step_cases.py).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from backends.base import GroupProgress, GroupWatch
from engine import claims, groups, pod_watch, pods, processing, slice_replace
from instances.models import GroupKind, Instance, InstanceGroup
from runs.models import Job, Run
from runs.services.submission import submit_run
from tests.engine.helpers import local_project_fleet
from tests.engine.outcome_helpers import around_body, steal

pytestmark = pytest.mark.django_db(transaction=True)


class FakeCloud:
    """What the steps ask a group backend, answered from the test's script."""

    def __init__(self, lost=(), ready=False):
        self.lost, self.ready = set(lost), ready
        self.deleted: list[str] = []
        self.polled: list[str] = []

    def terminate_group(self, name, backend_data):
        self.deleted.append(name)

    def poll_group(self, name, shape, backend_data):
        self.polled.append(name)
        return GroupProgress(None, {"polled": True})

    def watch_groups(self, groups):
        self.looking()
        return {name: GroupWatch(lost="preempted" if name in self.lost else "",
                                 lost_parts=(1,) if name in self.lost and groups[name].get("slices") else (),
                                 part_lost="PREEMPTED") for name in groups}

    def replace_part(self, name, backend_data, index, until):
        self.looking()
        return {**backend_data, "create": {"replaced_at": until, "index": index}}

    def looking(self):
        """Called while the watch holds its pods (a test takes the lease away here)."""


@pytest.fixture
def cloud(monkeypatch):
    fake = FakeCloud()
    for module in (groups, pods, pod_watch, slice_replace):
        monkeypatch.setattr(module, "compute_for_group", lambda *args, **kwargs: fake)
    return fake


def _pod(name: str, status: str, hosts: int = 2) -> InstanceGroup:
    fleet = local_project_fleet(size=1, name=f"fleet-{name}")
    group = InstanceGroup.objects.create(project=fleet.project, fleet=fleet, name=name, kind=GroupKind.TPU_POD,
                                         shape="v2-16", status=status, backend_data={"backend": "gcp"})
    instance_status = {"provisioning": "provisioning", "active": "idle", "terminating": "terminating"}[status]
    for k in range(hosts):
        Instance.objects.create(project=fleet.project, fleet=fleet, group=group, index=k, name=f"{name}-{k}",
                                status=instance_status, backend="gcp")
    return group


def _state(row) -> tuple:
    row.refresh_from_db()
    return row.status, row.lease_token


# ---- terminate_group ----------------------------------------------------------------------------


@pytest.mark.step_case("terminate_group", "eligibility")
@pytest.mark.step_case("terminate_group", "success")
def test_terminate_group_takes_a_terminating_group_only_and_ends_it_with_its_hosts(sent, cloud):
    active, doomed = _pod("alive", "active"), _pod("doomed", "terminating")
    assert not groups.terminate_group(active.pk), "a live group is deleted only once marked terminating"
    assert groups.terminate_group(doomed.pk)
    assert _state(doomed) == ("terminated", "") and cloud.deleted == ["doomed"]
    assert set(doomed.instances.values_list("status", flat=True)) == {"terminated"}
    assert sent.messages == []


@pytest.mark.step_case("terminate_group", "stale")
def test_terminate_group_with_a_stale_lease_leaves_the_group_to_its_holder(sent, cloud, monkeypatch):
    doomed = _pod("doomed", "terminating")
    around_body(monkeypatch, groups, "_terminate", steal(InstanceGroup))
    assert not groups.terminate_group(doomed.pk)
    assert _state(doomed) == ("terminating", "someone-else")
    assert set(doomed.instances.values_list("status", flat=True)) == {"terminating"}, "nothing half-applied"


@pytest.mark.step_case("terminate_group", "contention")
def test_terminate_group_does_nothing_while_another_worker_holds_it(sent, cloud):
    doomed = _pod("doomed", "terminating")
    token = claims.claim(InstanceGroup, doomed.pk)
    assert not groups.terminate_group(doomed.pk)
    assert _state(doomed) == ("terminating", token) and cloud.deleted == []
    claims.forget_all()


# ---- poll_pod -----------------------------------------------------------------------------------


@pytest.mark.step_case("poll_pod", "eligibility")
@pytest.mark.step_case("poll_pod", "success")
def test_poll_pod_takes_a_pod_being_created_and_schedules_its_next_look_once_free(sent, cloud):
    active, pod = _pod("alive", "active"), _pod("making", "provisioning")
    assert not pods.poll_pod(active.pk)
    before = InstanceGroup.objects.get(pk=pod.pk).updated
    assert pods.poll_pod(pod.pk)
    pod.refresh_from_db()
    assert (pod.status, pod.lease_token) == ("provisioning", "") and pod.updated > before
    assert pod.backend_data["polled"] is True
    assert sent.messages == [("poll_pod", pod.pk, pods.poll_interval(), False)]


@pytest.mark.step_case("poll_pod", "stale")
def test_poll_pod_with_a_stale_lease_sends_no_next_look(sent, cloud, monkeypatch):
    pod = _pod("making", "provisioning")
    around_body(monkeypatch, pods, "_poll", steal(InstanceGroup))
    assert pods.poll_pod(pod.pk)
    assert _state(pod) == ("provisioning", "someone-else") and sent.messages == []


def test_poll_pod_hands_a_pod_deleted_while_polled_to_terminate_group(sent, cloud, monkeypatch):
    pod = _pod("making", "provisioning")
    around_body(monkeypatch, pods, "_poll", lambda held: InstanceGroup.objects.filter(pk=held.pk).update(
        status="terminating"))
    assert pods.poll_pod(pod.pk)
    assert _state(pod) == ("terminating", "")
    assert sent.messages == [("terminate_group", pod.pk, 0, False)], "its delete, not another poll"


@pytest.mark.step_case("poll_pod", "success")
def test_poll_pod_that_gives_up_sends_the_delete_after_the_give_back(sent, cloud, settings):
    settings.MUSTER = {**settings.MUSTER, "WAITING_INSTANCE_LIMIT": 0}
    pod = _pod("making", "provisioning")
    InstanceGroup.objects.filter(pk=pod.pk).update(created=timezone.now() - timedelta(seconds=5))
    assert pods.poll_pod(pod.pk)
    assert _state(pod) == ("terminating", "")
    assert sent.messages == [("terminate_group", pod.pk, 0, False)], "sent once, to a free pod"


@pytest.mark.step_case("poll_pod", "contention")
def test_poll_pod_does_nothing_while_another_worker_polls_the_pod(sent, cloud):
    pod = _pod("making", "provisioning")
    token = claims.claim(InstanceGroup, pod.pk)
    assert not pods.poll_pod(pod.pk)
    assert _state(pod) == ("provisioning", token)
    assert cloud.polled == [] and sent.messages == [], "no second look at Google, no second next look"
    claims.forget_all()


# ---- watch_pods ---------------------------------------------------------------------------------


@pytest.mark.step_case("watch_pods", "eligibility")
@pytest.mark.step_case("watch_pods", "success")
def test_watch_pods_takes_live_pods_and_deletes_a_lost_one_after_the_give_back(sent, cloud):
    kept, lost, making = _pod("kept", "active"), _pod("lost", "active"), _pod("making", "provisioning")
    cloud.lost = {"lost"}
    assert pod_watch.watch_pods() == 2, "a pod still being created is poll_pod's"
    assert _state(kept) == ("active", "") and _state(lost) == ("terminating", "")
    assert _state(making) == ("provisioning", "")
    assert sent.messages == [("terminate_group", lost.pk, 0, False)]


@pytest.mark.step_case("watch_pods", "stale")
def test_watch_pods_with_a_stale_lease_sends_no_delete(sent, cloud, monkeypatch):
    lost = _pod("lost", "active")
    cloud.lost = {"lost"}
    around_body(monkeypatch, pod_watch, "_watch", steal(InstanceGroup))
    assert pod_watch.watch_pods() == 1
    assert _state(lost) == ("terminating", "someone-else") and sent.messages == []


@pytest.mark.step_case("watch_pods", "contention")
def test_watch_pods_skips_pods_another_worker_holds(sent, cloud):
    lost = _pod("lost", "active")
    cloud.lost = {"lost"}
    token = claims.claim(InstanceGroup, lost.pk)
    assert pod_watch.watch_pods() == 0
    assert _state(lost) == ("active", token)
    claims.forget_all()


def _set(sent, name: str, on_slice_failure: str) -> tuple[InstanceGroup, list[Job]]:
    """A live 2-slice set of 2 hosts each, every job of its run running on it."""
    pod = _pod(name, "active", hosts=4)
    InstanceGroup.objects.filter(pk=pod.pk).update(backend_data={"backend": "gcp", "slices": 2})
    run = submit_run(pod.project, None, {"configuration": f"type: task\nname: {name}\nnodes: 4\ncommands: [echo]\n"})
    conf = run.configuration
    conf["groups"][0]["on_slice_failure"] = on_slice_failure
    Run.objects.filter(pk=run.pk).update(status="running", configuration=conf)
    for job, host in zip(run.current_jobs().order_by("job_num"), pod.instances.order_by("index"), strict=True):
        Job.objects.filter(pk=job.pk).update(status="running", instance=host)
        Instance.objects.filter(pk=host.pk).update(status="busy")
    sent.clear()
    return InstanceGroup.objects.get(pk=pod.pk), list(run.current_jobs())


@pytest.mark.parametrize("policy", ["replace-slice", "whole-set"])
def test_watch_pods_that_loses_its_lease_before_its_move_writes_nothing_of_a_lost_slice(sent, cloud, policy):
    """The lease taken over while the watch works out a lost slice (replace_lost_slice's plan, or
    the look itself): no job ended, no host moved, the pod left as the new holder found it."""
    pod, jobs = _set(sent, f"set-{policy}", policy)
    cloud.lost = {pod.name}
    cloud.looking = lambda: InstanceGroup.objects.filter(pk=pod.pk).update(lease_token="someone-else")
    assert pod_watch.watch_pods() == 1
    assert _state(pod) == ("active", "someone-else")
    assert set(Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("status", flat=True)) == {"running"}
    assert set(pod.instances.values_list("status", flat=True)) == {"busy"}, "nothing half-written"
    assert sent.messages == []


@pytest.mark.parametrize("policy", ["replace-slice", "whole-set"])
def test_watch_pods_hands_a_set_deleted_under_it_to_terminate_group_without_ending_its_jobs(sent, cloud, policy):
    """A user's delete while the watch holds the pod: the delete ends the jobs itself; the watch
    writes nothing of its own and sends the delete's bounced message again, once the pod is free."""
    pod, jobs = _set(sent, f"deleted-{policy}", policy)
    cloud.lost = {pod.name}
    cloud.looking = lambda: InstanceGroup.objects.filter(pk=pod.pk).update(status="terminating")
    assert pod_watch.watch_pods() == 1
    assert _state(pod) == ("terminating", "")
    assert set(Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("status", flat=True)) == {"running"}
    assert sent.messages == [("terminate_group", pod.pk, 0, False)]


def test_watch_pods_replaces_a_lost_slice_of_a_replace_slice_set_keeping_the_other(sent, cloud):
    pod, jobs = _set(sent, "set", "replace-slice")
    cloud.lost = {pod.name}
    assert pod_watch.watch_pods() == 1
    assert _state(pod) == ("provisioning", "") and pod.backend_data["create"]["index"] == 1
    assert list(pod.instances.order_by("index").values_list("status", flat=True)) == [
        "busy", "busy", "provisioning", "provisioning"], "slice 0's hosts kept, slice 1's made again"
    ended = Job.objects.filter(pk__in=[j.pk for j in jobs])
    assert set(ended.values_list("termination_reason", flat=True)) == {"interrupted_by_no_capacity"}
    assert ("poll_pod", pod.pk, 0, False) in sent.messages


# ---- process_run --------------------------------------------------------------------------------


def _run(sent, name: str, status: str) -> Run:
    fleet = local_project_fleet(size=1, name=f"fleet-{name}")
    run = submit_run(fleet.project, None, {"configuration": f"type: task\nname: {name}\ncommands: [echo]\n"})
    Run.objects.filter(pk=run.pk).update(status="running")
    Job.objects.filter(run=run).update(status=status, termination_reason="done_by_runner")
    sent.clear()
    return Run.objects.get(pk=run.pk)


@pytest.mark.step_case("process_run", "eligibility")
@pytest.mark.step_case("process_run", "success")
def test_process_run_takes_an_active_run_and_records_what_it_derived(sent):
    run = _run(sent, "finished", "done")
    Run.objects.filter(pk=run.pk).update(status="done")
    assert not processing.process_run(run.pk), "a finished run is not derived again"
    Run.objects.filter(pk=run.pk).update(status="running")
    assert processing.process_run(run.pk)
    run.refresh_from_db()
    assert (run.status, run.lease_token) == ("done", "") and run.derived_at is not None


def test_process_run_derives_again_once_free_when_a_job_moved_while_it_held_the_run(sent, monkeypatch):
    run = _run(sent, "moving", "running")
    around_body(monkeypatch, processing, "_process", lambda held: Job.objects.filter(run=run).update(
        status_changed_at=timezone.now()))
    assert processing.process_run(run.pk)
    assert sent.messages == [("process_run", run.pk, 0, False)], "the dropped nudge is sent again, to a free run"


@pytest.mark.step_case("process_run", "stale")
def test_process_run_with_a_stale_lease_records_nothing(sent, monkeypatch):
    run = _run(sent, "stale", "running")
    around_body(monkeypatch, processing, "_process", steal(Run))
    assert processing.process_run(run.pk)
    run.refresh_from_db()
    assert run.lease_token == "someone-else" and run.derived_at is None and sent.messages == []


@pytest.mark.step_case("process_run", "contention")
def test_process_run_does_nothing_while_another_worker_holds_the_run(sent):
    run = _run(sent, "held", "done")
    token = claims.claim(Run, run.pk)
    assert not processing.process_run(run.pk)
    assert _state(run) == ("running", token)
    claims.forget_all()


# ---- process_runs: the runs of one finish_jobs step, one step ------------------------------------


@pytest.mark.step_case("process_runs", "eligibility")
@pytest.mark.step_case("process_runs", "success")
def test_process_runs_derives_each_active_run_it_names_in_one_step(sent):
    runs = [_run(sent, f"batch-{i}", "done") for i in range(3)]
    Run.objects.filter(pk=runs[2].pk).update(status="done")
    assert processing.process_runs([r.pk for r in runs]) == {runs[0].pk, runs[1].pk}, "a finished run is not derived"
    for run in runs:
        run.refresh_from_db()
    assert [(r.status, r.lease_token) for r in runs] == [("done", "")] * 3
    assert runs[0].derived_at is not None and runs[1].derived_at is not None and runs[2].derived_at is None


def test_process_runs_backs_off_the_run_whose_derive_failed_and_derives_the_others(sent, monkeypatch):
    runs = [_run(sent, f"fails-{i}", "done") for i in range(2)]
    real = processing._derive

    def derive(run, lease):
        if run.pk == runs[0].pk:
            raise RuntimeError("a bug on this run only")
        return real(run, lease)

    monkeypatch.setattr(processing, "_derive", derive)
    processing.process_runs([r.pk for r in runs])
    for run in runs:
        run.refresh_from_db()
    assert runs[0].status == "running" and runs[0].lease_until > timezone.now(), "backed off, due again later"
    assert (runs[1].status, runs[1].lease_token) == ("done", "")


@pytest.mark.step_case("process_runs", "stale")
def test_process_runs_with_a_stale_lease_records_nothing(sent, monkeypatch):
    runs = [_run(sent, f"stale-{i}", "running") for i in range(2)]
    around_body(monkeypatch, processing, "_process_each", steal(Run))
    processing.process_runs([r.pk for r in runs])
    for run in runs:
        run.refresh_from_db()
        assert run.lease_token == "someone-else" and run.derived_at is None
    assert sent.messages == []


@pytest.mark.step_case("process_runs", "contention")
def test_process_runs_leaves_a_run_another_worker_holds(sent):
    runs = [_run(sent, f"held-{i}", "done") for i in range(2)]
    token = claims.claim(Run, runs[0].pk)
    assert processing.process_runs([r.pk for r in runs]) == {runs[1].pk}
    assert _state(runs[0]) == ("running", token)
    assert _state(runs[1]) == ("done", "")
    claims.forget_all()
