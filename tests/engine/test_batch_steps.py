"""The batch job steps (advance_jobs, finish_jobs), each run in the test process on a faked runner
(no worker, no runner): the rows a step takes, what it leaves and sends, a stale lease, contention
(the four step cases, tests/test_step_cases.py), and that each row is acted on as its runner
answers, so a slow or silent host holds up no other row; and the messages a batch step gathers
(engine/messages.py `gathered`) as the steps before them send them.
"""

from __future__ import annotations

import threading

import pytest
from django.utils import timezone

from backends.base import BackendError
from engine import claims, finishing, log_copy
from engine.running import observe, watch
from engine.starting import advance
from engine.submitted import provision
from engine.submitted import waiting as waiting_rules
from instances.models import FleetQueue, Instance
from runs.choices import WAITING_FOR_HOST
from runs.models import AttachGrant, Job
from tests.engine.test_job_steps import _Compute, _Host, _jobs, _runners_say, _state

pytestmark = pytest.mark.django_db(transaction=True)


class _SlowFirst:
    """A slow host: its answer waits until the other rows of the batch were acted on (or 10 s)."""

    def __init__(self, jobs: list[Job]) -> None:
        self.others = {j.pk for j in jobs[1:]}
        self.acted: list[int] = []
        self.done = threading.Event()
        self.waited: list[bool] = []

    def wait(self) -> None:
        self.waited.append(self.done.wait(timeout=10))

    def act(self, pk: int) -> None:
        self.acted.append(pk)
        if set(self.acted) >= self.others:
            self.done.set()


# ---- finish_jobs: the ends one watch batch saw, one step ----------------------------------------


def test_a_watch_batch_that_sees_several_jobs_end_sends_one_finish_jobs_for_them(sent, monkeypatch):
    jobs = _jobs(sent, nodes=3, status="running", runner_submitted=True)
    _runners_say(monkeypatch, {jobs[0].pk: "done", jobs[1].pk: "running", jobs[2].pk: "failed"})
    assert watch.watch_running() == 3
    assert [_state(j)[0] for j in jobs] == ["terminating", "running", "terminating"]
    assert sent.messages == [("finish_jobs", [jobs[0].pk, jobs[2].pk], 0, False), ("process_run", jobs[0].run_id, 0, False)], \
        "one message names the batch's ended jobs, sent once they are free (and a failure derives the run at once)"


@pytest.mark.step_case("finish_jobs", "eligibility")
@pytest.mark.step_case("finish_jobs", "success")
def test_finish_jobs_ends_the_terminating_jobs_it_names_and_asks_for_their_fleets_and_runs_once(sent):
    (queued,) = _jobs(sent, name="waits")
    Job.objects.filter(pk=queued.pk).update(waiting_for=f"{WAITING_FOR_HOST}: fleet fleet-steps is full")
    pair = _jobs(sent, nodes=2, status="terminating", termination_reason="done_by_runner")
    (other,) = _jobs(sent, name="other", status="terminating", termination_reason="done_by_runner")
    (running,) = _jobs(sent, name="third", status="running")
    ids = [pair[0].pk, running.pk, pair[1].pk, other.pk]
    assert finishing.finish_jobs(ids) == {pair[0].pk, pair[1].pk, other.pk}
    assert [_state(j) for j in [*pair, other, running]] == [("done", ""), ("done", ""), ("done", ""), ("running", "")]
    ended = [*pair, other]
    assert set(Instance.objects.filter(pk__in=[j.instance_id for j in ended]).values_list("status", flat=True)) == {"idle"}
    fleets = sorted({Instance.objects.get(pk=j.instance_id).fleet_id for j in ended})
    gather = waiting_rules.GATHER_SECONDS
    assert sent.messages == [*[("admit_fleet", f, gather, False) for f in fleets],
                             ("process_runs", sorted([pair[0].run_id, other.run_id]), 0, False)], \
        "each fleet's look asked once for the step's releases, then the two runs derived in one message"
    assert dict(FleetQueue.objects.filter(fleet_id__in=fleets).values_list("fleet_id", "wanted")) == \
        dict.fromkeys(fleets, 1), "the pair's two hosts counted as one release on their fleet's row"


def test_finish_jobs_backs_off_the_job_whose_finish_failed_and_ends_the_others(sent, monkeypatch):
    jobs = _jobs(sent, nodes=2, status="terminating", termination_reason="done_by_runner", runner_submitted=True)
    def finished(job, grants=None, asked=None):
        if job.pk == jobs[0].pk:
            raise RuntimeError("a bug on this job only")
        return True

    monkeypatch.setattr(finishing, "_runner_finished", finished)
    assert finishing.finish_jobs([j.pk for j in jobs]) == {jobs[1].pk}
    jobs[0].refresh_from_db()
    assert jobs[0].status == "terminating" and jobs[0].lease_until > timezone.now(), "backed off, due again later"
    assert _state(jobs[1]) == ("done", "")
    assert Instance.objects.get(pk=jobs[0].instance_id).status == "busy", "its host is not handed back"


def test_finish_jobs_marks_only_the_ending_jobs_attach_grants_due(sent, monkeypatch):
    jobs = _jobs(sent, nodes=2, status="terminating", termination_reason="done_by_runner")
    (running,) = _jobs(sent, name="kept", status="running")
    for job in (jobs[1], running):
        AttachGrant.objects.create(job=job, instance_id=job.instance_id, project_id=job.run.project_id,
                                   marker=f"grant-{job.pk}")
    assert finishing.finish_jobs([j.pk for j in jobs]) == {j.pk for j in jobs}
    assert dict(AttachGrant.objects.values_list("job_id", "revoke_due")) == {jobs[1].pk: True, running.pk: False}


def _stolen_after(monkeypatch, module, name: str) -> None:
    """`module.name(job, ...)`, the batch step's work on one row, then the row's lease taken by
    another holder (it ran out meanwhile), before the step gives it back."""
    real = getattr(module, name)

    def then_stolen(job, *args):
        outcome = real(job, *args)
        Job.objects.filter(pk=job.pk).update(lease_token="someone-else", lease_until=timezone.now())
        return outcome

    monkeypatch.setattr(module, name, then_stolen)

@pytest.mark.step_case("finish_jobs", "stale")
def test_finish_jobs_with_a_stale_lease_keeps_the_jobs_and_their_hosts(sent, monkeypatch):
    jobs = _jobs(sent, nodes=2, status="terminating", termination_reason="done_by_runner")
    _stolen_after(monkeypatch, finishing, "_finish_one")  # each job is given back as soon as it is finished
    assert finishing.finish_jobs([j.pk for j in jobs]) == set()
    assert [_state(j) for j in jobs] == [("terminating", "someone-else")] * 2
    assert set(Instance.objects.filter(pk__in=[j.instance_id for j in jobs]).values_list("status", flat=True)) == {"busy"}
    assert sent.messages == [], "the new holder hands the hosts back and asks for the run"


@pytest.mark.step_case("finish_jobs", "contention")
def test_finish_jobs_leaves_a_job_another_worker_holds(sent):
    jobs = _jobs(sent, nodes=2, status="terminating", termination_reason="done_by_runner")
    token = claims.claim(Job, jobs[0].pk)
    assert finishing.finish_jobs([j.pk for j in jobs]) == {jobs[1].pk}
    assert _state(jobs[0]) == ("terminating", token)
    assert _state(jobs[1]) == ("done", "")
    claims.forget_all()


# ---- advance_jobs: the jobs one placement step placed, one step (the runners faked: observe.look) --


def _starting_runners_say(monkeypatch, states: dict[int, str | None]) -> list[str]:
    """Each host's runner reports its job in `states[job]` (None: the host does not answer); returns
    the names of the threads the looks were made on."""
    threads: list[str] = []
    by_host: dict[int, tuple[int, str]] = {}

    def runner_host(self, instance):  # on the step's thread: the looks' threads touch no database
        host = _Host()
        job = Job.objects.get(instance=instance, status__in=["provisioning", "pulling", "running"])
        by_host[id(host)] = (job.pk, job.runner_job_id)
        return host

    def look(host, follow=None):
        threads.append(threading.current_thread().name)
        pk, runner_job_id = by_host[id(host)]
        if states[pk] is None:
            return None, BackendError("connection timed out")
        return {"agent_alive": True, "jobs": {runner_job_id: {"state": states[pk], "start_time": 1.0}}}, None

    monkeypatch.setattr(_Compute, "runner_host", runner_host)
    monkeypatch.setattr(advance, "compute_for_instance", lambda instance: _Compute())
    monkeypatch.setattr(observe, "look", look)
    return threads


def test_a_placement_step_that_places_several_jobs_sends_one_advance_jobs_for_them(sent):
    waiting = _jobs(sent, nodes=3)
    placed, held = provision.provision_jobs([waiting[0].pk])
    assert placed and held == {waiting[0].pk}
    assert [_state(j)[0] for j in waiting] == ["provisioning"] * 3, "job 0 placed its gang"
    starts = [m for m in sent.messages if m[0].startswith("advance_job")]
    assert starts == [("advance_jobs", sorted(j.pk for j in waiting), 0, False)], \
        "the gang's starts go as one message, once every job is free"


@pytest.mark.step_case("advance_jobs", "eligibility")
@pytest.mark.step_case("advance_jobs", "success")
def test_advance_jobs_looks_at_its_jobs_runners_at_once_and_advances_each(sent, monkeypatch):
    jobs = _jobs(sent, nodes=3, status="provisioning", runner_submitted=True)
    (queued,) = _jobs(sent, name="other")
    threads = _starting_runners_say(monkeypatch, {jobs[0].pk: "running", jobs[1].pk: "starting",
                                                  jobs[2].pk: "running"})
    assert advance.advance_jobs([*(j.pk for j in jobs), queued.pk]) == {j.pk for j in jobs}, \
        "a submitted job is provision_job's"
    assert [_state(j) for j in jobs] == [("running", ""), ("provisioning", ""), ("running", "")]
    assert len(threads) == 3 and all(t.startswith("watch") for t in threads), "the looks went out in threads"
    assert sent.messages == [("advance_job", jobs[1].pk, advance.next_look(jobs[1]), False)], \
        "the one still starting is looked at again, once free; the others are the watch's now"
    jobs[1].refresh_from_db()
    assert jobs[1].agent_seen_at is not None, "what a look learned is written with the give-back"


def test_advance_jobs_ends_the_job_whose_host_does_not_answer_without_holding_the_others(sent, monkeypatch,
                                                                                        settings):
    settings.MUSTER = {**settings.MUSTER, "UNREACHABLE_GRACE": 0}
    jobs = _jobs(sent, nodes=2, status="provisioning", runner_submitted=True)
    _starting_runners_say(monkeypatch, {jobs[0].pk: None, jobs[1].pk: "running"})
    assert advance.advance_jobs([j.pk for j in jobs]) == {j.pk for j in jobs}
    assert _state(jobs[0]) == ("terminating", ""), "past UNREACHABLE_GRACE its job ends"
    assert _state(jobs[1]) == ("running", "")
    assert Instance.objects.get(pk=jobs[0].instance_id).unreachable, "the silent host is marked so"
    assert ("finish_job", jobs[0].pk, 0, False) in sent.messages


@pytest.mark.step_case("advance_jobs", "stale")
def test_advance_jobs_with_a_stale_lease_drops_its_outcomes(sent, monkeypatch):
    jobs = _jobs(sent, nodes=2, status="provisioning", runner_submitted=True)
    _starting_runners_say(monkeypatch, {j.pk: "starting" for j in jobs})
    _stolen_after(monkeypatch, advance, "_advance_one")  # each job is given back as soon as it is advanced
    advance.advance_jobs([j.pk for j in jobs])
    for job in jobs:
        job.refresh_from_db()
        assert job.lease_token == "someone-else" and job.agent_seen_at is None, "no field of the outcome is written"
    assert sent.messages == []


@pytest.mark.step_case("advance_jobs", "contention")
def test_advance_jobs_leaves_a_job_another_worker_holds(sent, monkeypatch):
    jobs = _jobs(sent, nodes=2, status="provisioning", runner_submitted=True)
    threads = _starting_runners_say(monkeypatch, {j.pk: "running" for j in jobs})
    token = claims.claim(Job, jobs[0].pk)
    assert advance.advance_jobs([j.pk for j in jobs]) == {jobs[1].pk}
    assert _state(jobs[0]) == ("provisioning", token)
    assert _state(jobs[1]) == ("running", "")
    assert len(threads) == 1, "the runner of a job somebody else holds is not asked"
    claims.forget_all()


def _finishing_hosts(monkeypatch, on_status, on_cleanup) -> None:
    """finish_jobs' hosts faked: each runner reports its job done after `on_status(job id)` (which
    may wait, or raise as a host that does not answer), and its cleanup calls `on_cleanup(job id)`.
    Made on the step's thread (the job read there), so the asking threads touch no database."""
    class Host:
        def __init__(self, job):
            self.pk, self.runner_job_id = job.pk, job.runner_job_id

        def status(self):
            on_status(self.pk)
            return {"agent_alive": True, "jobs": {self.runner_job_id: {"state": "done"}}}

        def cleanup(self, runner_job_id):
            on_cleanup(self.pk)

        def close(self):
            pass

    class Compute:
        def runner_host(self, instance):
            return Host(Job.objects.get(instance=instance, status="terminating"))

    monkeypatch.setattr(finishing, "compute_for_instance", lambda instance: Compute())
    monkeypatch.setattr(log_copy, "keep_copy", lambda job, host: None)


def test_finish_jobs_asks_the_runners_at_once_and_a_silent_host_holds_none_of_the_others(sent, monkeypatch):
    jobs = _jobs(sent, nodes=3, status="terminating", termination_reason="done_by_runner", runner_submitted=True)
    asked, cleaned = [], []

    def status(pk):
        asked.append(threading.current_thread().name)
        if pk == jobs[0].pk:
            raise BackendError("connection timed out")

    _finishing_hosts(monkeypatch, status, cleaned.append)
    assert finishing.finish_jobs([j.pk for j in jobs]) == {j.pk for j in jobs}
    assert [_state(j) for j in jobs] == [("done", "")] * 3, "the silent host's job ends too: its host is handed back"
    assert len(asked) == 3 and all(name.startswith("watch") for name in asked), "asked in threads"
    assert sorted(cleaned) == [jobs[1].pk, jobs[2].pk], "the answering hosts' job directories are removed"


def test_finish_jobs_acts_on_each_runner_s_answer_as_it_comes(sent, monkeypatch):
    jobs = _jobs(sent, nodes=3, status="terminating", termination_reason="done_by_runner", runner_submitted=True)
    slow = _SlowFirst(jobs)
    _finishing_hosts(monkeypatch, lambda pk: slow.wait() if pk == jobs[0].pk else None, slow.act)
    assert finishing.finish_jobs([j.pk for j in jobs]) == {j.pk for j in jobs}
    assert slow.waited == [True], "the two answering hosts' jobs were finished while the slow one had not answered"
    assert set(slow.acted[:2]) == {jobs[1].pk, jobs[2].pk} and slow.acted[2] == jobs[0].pk, "the slow one last"


def test_advance_jobs_acts_on_each_runner_s_answer_as_it_comes(sent, monkeypatch):
    jobs = _jobs(sent, nodes=3, status="provisioning", runner_submitted=True)
    slow = _SlowFirst(jobs)
    by_host: dict[int, tuple[int, str]] = {}

    def runner_host(self, instance):
        host = _Host()
        job = Job.objects.get(instance=instance)
        by_host[id(host)] = (job.pk, job.runner_job_id)
        return host

    def look(host, follow=None):
        pk, runner_job_id = by_host[id(host)]
        if pk == jobs[0].pk:
            slow.wait()
        return {"agent_alive": True, "jobs": {runner_job_id: {"state": "running", "start_time": 1.0}}}, None

    real = advance._advance_one

    def advanced(job, *args):
        outcome = real(job, *args)
        slow.act(job.pk)
        return outcome

    monkeypatch.setattr(_Compute, "runner_host", runner_host)
    monkeypatch.setattr(advance, "compute_for_instance", lambda instance: _Compute())
    monkeypatch.setattr(observe, "look", look)
    monkeypatch.setattr(advance, "_advance_one", advanced)
    assert advance.advance_jobs([j.pk for j in jobs]) == {j.pk for j in jobs}
    assert slow.waited == [True], "the answering hosts' jobs were advanced while the slow one had not answered"
    assert set(slow.acted[:2]) == {jobs[1].pk, jobs[2].pk} and slow.acted[2] == jobs[0].pk, "the slow one last"
    assert [_state(j) for j in jobs] == [("running", "")] * 3
