"""The job steps as process -> outcome -> guarded apply, each run in the test process on a fake runner
status (no worker, no runner): which rows a step takes, what it leaves and sends on success, that a
stale lease makes it drop its outcome, that it does nothing while another worker holds the row, and
that a row stopped under it is handed to finish_job. Each of the four cases is marked step_case
(tests/test_step_cases.py wants all four of every step).
"""

from __future__ import annotations

import os
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from engine import claims, finishing
from engine.running import observe, watch
from engine.starting import advance
from engine.submitted import provision
from engine.submitted import waiting as waiting_rules
from instances.models import Fleet, Instance
from runs.choices import WAITING_FOR_HOST
from runs.models import Job
from runs.services.submission import submit_run
from tests.engine.helpers import local_project_fleet
from tests.engine.outcome_helpers import around_body, steal, stop_job

pytestmark = pytest.mark.django_db(transaction=True)


def _jobs(sent, nodes: int = 1, name: str = "steps", status: str = "submitted", **fields) -> list[Job]:
    fleet = local_project_fleet(size=nodes + 1, name=f"fleet-{name}")
    run = submit_run(fleet.project, None, {"configuration": f"type: task\nname: {name}\nnodes: {nodes}\n"
                                                            "commands: [echo]\n"})
    jobs = list(run.current_jobs().order_by("job_num"))
    if status != "submitted":
        hosts = list(fleet.instances.order_by("index"))
        run.__class__.objects.filter(pk=run.pk).update(status="running", fleet=fleet)
        for job, host in zip(jobs, hosts, strict=False):
            Instance.objects.filter(pk=host.pk).update(status="busy")
            Job.objects.filter(pk=job.pk).update(status=status, instance=host, waiting_master_job=False,
                                                 status_changed_at=timezone.now(), **fields)
    sent.clear()
    return [Job.objects.get(pk=j.pk) for j in jobs]


def _state(job: Job) -> tuple:
    job.refresh_from_db()
    return job.status, job.lease_token


# ---- provision_job ------------------------------------------------------------------------------


@pytest.mark.step_case("provision_job", "eligibility")
@pytest.mark.step_case("provision_job", "success")
def test_provision_takes_only_a_released_job_and_sends_its_start_once_the_job_is_free(sent):
    master, member = _jobs(sent, nodes=2)
    Job.objects.filter(pk=member.pk).update(waiting_master_job=True)
    assert not provision.provision_job(member.pk), "a job its master has not released is not taken"
    assert sent.messages == []
    assert provision.provision_job(master.pk)
    assert _state(master) == ("provisioning", "")
    assert ("advance_jobs", sorted([master.pk, member.pk]), 0, False) in sent.messages, \
        "the gang's starts, sent after the give-back, to free jobs"


@pytest.mark.step_case("provision_job", "stale")
def test_provision_with_a_stale_lease_drops_its_follow_up(sent, monkeypatch):
    (job,) = _jobs(sent)
    around_body(monkeypatch, provision, "_provision", steal(Job))
    assert provision.provision_job(job.pk)
    job.refresh_from_db()
    assert job.lease_token == "someone-else", "the new holder's lease is left alone"
    assert ("advance_job", job.pk) not in sent.names(), "nothing is sent for a row that is not ours"


def test_provision_of_a_job_stopped_while_held_hands_it_to_finish_job(sent, monkeypatch):
    (job,) = _jobs(sent)
    around_body(monkeypatch, provision, "_provision", stop_job)
    assert provision.provision_job(job.pk)
    assert _state(job) == ("terminating", "")
    assert [m for m in sent.names() if m[1] == job.pk] == [("finish_job", job.pk)]


@pytest.mark.step_case("provision_job", "contention")
def test_provision_does_nothing_while_another_worker_holds_the_job(sent):
    (job,) = _jobs(sent)
    token = claims.claim(Job, job.pk)
    assert not provision.provision_job(job.pk)
    assert _state(job) == ("submitted", token) and sent.messages == []
    claims.forget_all()


# ---- recheck_jobs (the sweep's rechecks of jobs waiting for a host, one batch) ----------------------

WAITER = "type: task\nname: {name}\ncommands: [echo]\nretry: {{on_events: [no-capacity], duration: 1h}}\n"


def _waiter(sent, name: str, idle: int) -> Job:
    """Job 0 of a run waiting for a host of its own 1-host fleet, its recheck due; `idle`: hosts idle now."""
    fleet = local_project_fleet(size=1, name=f"fleet-{name}")
    run = submit_run(fleet.project, None, {"configuration": WAITER.format(name=name)})
    fleet.instances.update(status="idle" if idle else "busy")
    Job.objects.filter(run=run).update(waiting_for=f"{WAITING_FOR_HOST}: fleet fleet-{name} is full",
                                       next_check_at=timezone.now() - timedelta(seconds=1))
    sent.clear()
    return run.current_jobs().get(job_num=0)


@pytest.mark.step_case("recheck_jobs", "eligibility")
@pytest.mark.step_case("recheck_jobs", "success")
def test_recheck_takes_the_released_waiting_jobs_keeps_the_full_fleet_s_waiting_and_asks_the_look_once_free(sent):
    full = _waiter(sent, "full", idle=0)
    room = _waiter(sent, "room", idle=1)
    held_back = _waiter(sent, "held", idle=0)
    Job.objects.filter(pk=held_back.pk).update(waiting_master_job=True)
    assert provision.recheck_jobs([full.pk, room.pk, held_back.pk]) == {full.pk, room.pk}
    full.refresh_from_db()
    assert (full.status, full.lease_token) == ("submitted", "") and full.waiting_for.startswith(WAITING_FOR_HOST)
    assert full.next_check_at > timezone.now(), "looked at: due again a recheck later"
    assert _state(room) == ("submitted", ""), "left to its fleet's look, which it asked"
    fleet = Fleet.objects.get(name="fleet-room")
    assert sent.messages == [("admit_fleet", fleet.pk, waiting_rules.GATHER_SECONDS, False)], \
        "sent once the batch was given back"
    assert Job.objects.get(pk=held_back.pk).next_check_at < timezone.now(), "a job its master holds is not taken"


@pytest.mark.step_case("recheck_jobs", "stale")
def test_recheck_with_a_stale_lease_leaves_the_job_to_its_new_holder(sent, monkeypatch):
    room = _waiter(sent, "room", idle=1)
    around_body(monkeypatch, provision, "_provision_each", steal(Job))
    provision.recheck_jobs([room.pk])
    assert _state(room) == ("submitted", "someone-else")
    assert sent.messages == [], "the look is asked by whoever holds the job now"


@pytest.mark.step_case("recheck_jobs", "contention")
def test_recheck_does_nothing_while_another_worker_holds_the_job(sent):
    full = _waiter(sent, "full", idle=0)
    token = claims.claim(Job, full.pk)
    assert provision.recheck_jobs([full.pk]) == set()
    assert _state(full) == ("submitted", token) and sent.messages == []
    assert Job.objects.get(pk=full.pk).next_check_at < timezone.now()
    claims.forget_all()


# ---- advance_job (the runner's status is faked: advance._observe) ---------------------------------


def _runner_says(monkeypatch, state: str) -> None:
    def observe_(job, looked=None):
        job.agent_seen_at = timezone.now()
        return {"agent_alive": True, "jobs": {job.runner_job_id: {"state": state, "start_time": 1.0}}}

    monkeypatch.setattr(advance, "_observe", observe_)


@pytest.mark.step_case("advance_job", "eligibility")
@pytest.mark.step_case("advance_job", "success")
def test_advance_takes_a_placed_job_only_and_looks_again_once_it_is_free(sent, monkeypatch):
    _runner_says(monkeypatch, "starting")
    (job,) = _jobs(sent, status="provisioning", runner_submitted=True)
    (waiting,) = _jobs(sent, name="other")
    assert not advance.advance_job(waiting.pk), "a submitted job is provision_job's, not advance_job's"
    assert advance.advance_job(job.pk)
    job.refresh_from_db()
    assert (job.status, job.lease_token) == ("provisioning", "") and job.agent_seen_at is not None
    assert job.next_check_at > timezone.now(), "what it learned is written with the give-back"
    assert sent.messages == [("advance_job", job.pk, advance.next_look(job), False)]


@pytest.mark.step_case("advance_job", "success")
def test_advance_of_a_job_that_ends_sends_finish_job_after_the_give_back(sent, monkeypatch):
    _runner_says(monkeypatch, "done")
    (job,) = _jobs(sent, status="provisioning", runner_submitted=True)
    assert advance.advance_job(job.pk)
    assert _state(job) == ("terminating", "")
    assert sent.messages == [("finish_job", job.pk, 0, False)]


@pytest.mark.step_case("advance_job", "stale")
def test_advance_with_a_stale_lease_drops_its_outcome(sent, monkeypatch):
    _runner_says(monkeypatch, "starting")
    (job,) = _jobs(sent, status="provisioning", runner_submitted=True)
    around_body(monkeypatch, advance, "_advance", steal(Job))
    assert advance.advance_job(job.pk)
    job.refresh_from_db()
    assert job.lease_token == "someone-else" and job.agent_seen_at is None, "no field of the outcome is written"
    assert sent.messages == []


def test_advance_of_a_job_stopped_while_held_hands_it_to_finish_job(sent, monkeypatch):
    _runner_says(monkeypatch, "starting")
    (job,) = _jobs(sent, status="provisioning", runner_submitted=True)
    around_body(monkeypatch, advance, "_advance", stop_job)
    assert advance.advance_job(job.pk)
    assert _state(job) == ("terminating", "")
    assert sent.messages == [("finish_job", job.pk, 0, False)], "handed over, and no further look"


@pytest.mark.step_case("advance_job", "contention")
def test_advance_does_nothing_while_another_worker_holds_the_job(sent, monkeypatch):
    looked = []
    monkeypatch.setattr(advance, "_observe", lambda job, _looked=None: looked.append(job.pk))
    (job,) = _jobs(sent, status="provisioning", runner_submitted=True)
    token = claims.claim(Job, job.pk)
    assert not advance.advance_job(job.pk)
    assert _state(job) == ("provisioning", token) and sent.messages == []
    assert looked == [], "the runner is not asked about a job somebody else holds"
    claims.forget_all()


# ---- watch_running (the runners' answers are faked: observe.look) ---------------------------------


class _Host:
    def close(self):
        pass


class _Compute:
    def runner_host(self, instance):
        return _Host()


def _runners_say(monkeypatch, states: dict[int, str]) -> None:
    monkeypatch.setattr(watch, "compute_for_instance", lambda instance: _Compute())
    by_host = {}

    def look(host, follow=None):
        return by_host[id(host)], None

    def runner_host(instance):
        host = _Host()
        job = Job.objects.get(instance=instance, status="running")
        by_host[id(host)] = {"agent_alive": True, "jobs": {job.runner_job_id: {
            "state": states[job.pk], "start_time": 1.0, "end_time": 2.0, "exit_status": 0}}}
        return host

    monkeypatch.setattr(_Compute, "runner_host", lambda self, instance: runner_host(instance))
    monkeypatch.setattr(observe, "look", look)


@pytest.mark.step_case("watch_running", "eligibility")
@pytest.mark.step_case("watch_running", "success")
def test_watch_takes_the_due_running_jobs_and_gives_the_batch_back_in_one_statement(sent, monkeypatch):
    jobs = _jobs(sent, nodes=3, status="running", runner_submitted=True)
    later = timezone.now() + timedelta(hours=1)
    Job.objects.filter(pk=jobs[2].pk).update(next_check_at=later)  # not due
    _runners_say(monkeypatch, {jobs[0].pk: "running", jobs[1].pk: "done", jobs[2].pk: "running"})
    with CaptureQueriesContext(connection) as queries:
        assert watch.watch_running() == 2
    give_backs = [q["sql"] for q in queries if q["sql"].startswith('UPDATE "runs_job" SET "lease_until" = NULL')]
    assert len(give_backs) == 1, give_backs
    assert [_state(j) for j in jobs] == [("running", ""), ("terminating", ""), ("running", "")]
    assert sent.messages == [("finish_job", jobs[1].pk, 0, False)]
    jobs[0].refresh_from_db()
    assert jobs[0].agent_seen_at is not None and jobs[0].next_check_at > timezone.now()


def test_the_watch_writes_the_answering_hosts_last_seen_in_one_statement(sent, monkeypatch):
    jobs = _jobs(sent, nodes=3, status="running", runner_submitted=True)
    hosts = [j.instance_id for j in jobs]
    Instance.objects.filter(pk__in=hosts).update(last_seen=timezone.now() - timedelta(minutes=1))
    Instance.objects.filter(pk=hosts[2]).update(last_seen=timezone.now())  # seen a moment ago: no write
    _runners_say(monkeypatch, {j.pk: "running" for j in jobs})
    with CaptureQueriesContext(connection) as queries:
        assert watch.watch_running() == 3
    seen = [q["sql"] for q in queries if q["sql"].startswith('UPDATE "instances_instance" SET "last_seen"')]
    assert len(seen) == 1, seen
    give_back = [q["sql"] for q in queries if q["sql"].startswith('UPDATE "runs_job" SET "lease_until" = NULL')]
    assert len(give_back) == 1 and "CASE" not in give_back[0], "one agent_seen_at for the batch, not one per job"
    fresh = timezone.now() - timedelta(seconds=10)
    assert set(Instance.objects.filter(pk__in=hosts, last_seen__gt=fresh).values_list("pk", flat=True)) == set(hosts)


def test_the_watch_reads_the_same_statements_for_more_jobs_and_keeps_its_look_threads_between_batches(
        sent, monkeypatch):
    started = []
    real_pool = watch.ThreadPoolExecutor
    monkeypatch.setattr(watch, "ThreadPoolExecutor", lambda **kw: started.append(kw) or real_pool(**kw))
    monkeypatch.setattr(watch, "_pool", None)
    jobs = _jobs(sent, nodes=3, status="running", runner_submitted=True)
    _runners_say(monkeypatch, {j.pk: "running" for j in jobs})
    with CaptureQueriesContext(connection) as three:
        assert watch.watch_running() == 3
    assert not any("submitted_text" in q["sql"] for q in three), "what the user wrote is not read by a look"
    Job.objects.filter(pk__in=[j.pk for j in jobs]).update(next_check_at=None)
    assert watch.watch_running() == 3
    assert len(started) == 1, "the second batch looks with the first one's threads"

    more = _jobs(sent, nodes=6, name="more", status="running", runner_submitted=True)
    _runners_say(monkeypatch, {j.pk: "running" for j in more})
    Job.objects.filter(pk__in=[j.pk for j in jobs]).update(next_check_at=timezone.now() + timedelta(hours=1))
    with CaptureQueriesContext(connection) as six:
        assert watch.watch_running() == 6

    def product(queries) -> list[str]:  # without the fake runners' own reads (_runners_say)
        return [q["sql"] for q in queries if 'WHERE ("runs_job"."instance_id" =' not in q["sql"]]
    assert len(product(six)) == len(product(three)), (product(three), product(six))

    # a forked child (a prefork worker's) makes threads of its own: its parent's do not follow a fork
    pid = os.getpid()
    monkeypatch.setattr(watch, "_pid", lambda: pid + 1)
    Job.objects.filter(pk__in=[j.pk for j in more]).update(next_check_at=None)
    assert watch.watch_running() == 6
    assert len(started) == 2


@pytest.mark.skipif(connection.vendor != "postgresql", reason="heap-only updates are PostgreSQL's")
def test_the_watch_s_claim_and_give_back_of_a_running_job_are_heap_only_updates(sent, monkeypatch):
    jobs = _jobs(sent, nodes=3, status="running", runner_submitted=True)
    _runners_say(monkeypatch, {j.pk: "running" for j in jobs})

    def counts() -> tuple[int, int]:  # this transaction's updates of runs_job so far: all, heap-only
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_get_xact_tuples_updated('runs_job'::regclass), "
                           "pg_stat_get_xact_tuples_hot_updated('runs_job'::regclass)")
            return cursor.fetchone()

    before = counts()
    assert watch.watch_running() == 3
    updated, hot = (after - was for after, was in zip(counts(), before, strict=True))
    # each job: claimed, given back (lease, next_check_at, agent_seen_at): no index entry written
    assert updated == 6 and hot == 6, (updated, hot)


@pytest.mark.step_case("watch_running", "stale")
def test_watch_with_a_stale_lease_drops_that_job_only(sent, monkeypatch):
    jobs = _jobs(sent, nodes=2, status="running", runner_submitted=True)
    _runners_say(monkeypatch, {jobs[0].pk: "running", jobs[1].pk: "done"})

    def steal_second(held):
        Job.objects.filter(pk=jobs[1].pk).update(lease_token="someone-else")

    around_body(monkeypatch, watch, "_watch", steal_second)
    assert watch.watch_running() == 2
    assert _state(jobs[0]) == ("running", "")
    assert _state(jobs[1]) == ("terminating", "someone-else")
    assert sent.messages == [], "the stale job's finish_job is its new holder's to send"


def test_watch_hands_a_job_stopped_while_held_to_finish_job(sent, monkeypatch):
    jobs = _jobs(sent, nodes=2, status="running", runner_submitted=True)
    _runners_say(monkeypatch, {jobs[0].pk: "running", jobs[1].pk: "running"})

    def stop_second(held):
        Job.objects.filter(pk=jobs[1].pk).update(status="terminating", termination_reason="terminated_by_user")

    around_body(monkeypatch, watch, "_watch", stop_second)
    assert watch.watch_running() == 2
    assert [_state(j) for j in jobs] == [("running", ""), ("terminating", "")]
    assert sent.messages == [("finish_job", jobs[1].pk, 0, False)]


@pytest.mark.step_case("watch_running", "contention")
def test_watch_skips_running_jobs_another_worker_holds(sent, monkeypatch):
    jobs = _jobs(sent, nodes=2, status="running", runner_submitted=True)
    _runners_say(monkeypatch, {jobs[0].pk: "done", jobs[1].pk: "done"})
    token = claims.claim(Job, jobs[0].pk)
    assert watch.watch_running() == 1, "the held job is not looked at"
    assert _state(jobs[0]) == ("running", token)
    assert _state(jobs[1]) == ("terminating", "")
    assert sent.messages == [("finish_job", jobs[1].pk, 0, False)]
    claims.forget_all()


# ---- finish_job ---------------------------------------------------------------------------------


@pytest.mark.step_case("finish_job", "eligibility")
@pytest.mark.step_case("finish_job", "success")
def test_finish_takes_a_terminating_job_only_and_ends_it_with_its_host_handed_back(sent):
    (job,) = _jobs(sent, status="terminating", termination_reason="done_by_runner")
    (running,) = _jobs(sent, name="other", status="running")
    assert not finishing.finish_job(running.pk), "a running job is not finish_job's"
    assert finishing.finish_job(job.pk)
    assert _state(job) == ("done", "")
    host = Instance.objects.get(pk=job.instance_id)
    assert host.status == "idle"
    assert sent.messages == [("process_run", job.run_id, 0, False)], \
        "nobody waits for a host: no admission look; the ended job's run is derived"


def test_finish_of_a_job_while_a_run_waits_sends_its_fleets_admission_look_first(sent):
    (waiting,) = _jobs(sent, name="waits")
    Job.objects.filter(pk=waiting.pk).update(waiting_for=f"{WAITING_FOR_HOST}: fleet fleet-steps is full")
    (job,) = _jobs(sent, status="terminating", termination_reason="done_by_runner")
    assert finishing.finish_job(job.pk)
    host = Instance.objects.get(pk=job.instance_id)
    gather = waiting_rules.GATHER_SECONDS
    assert sent.messages == [("admit_fleet", host.fleet_id, gather, False), ("process_run", job.run_id, 0, False)], \
        "the host's fleet looks at who gets it (after the gather); the ended job's run is derived"


@pytest.mark.step_case("finish_job", "success")
def test_finish_of_a_job_still_running_sends_its_recheck_once_the_job_is_free(sent, monkeypatch):
    (job,) = _jobs(sent, status="terminating", termination_reason="done_by_runner", runner_submitted=True)
    monkeypatch.setattr(finishing, "_runner_finished", lambda job, grants=None, asked=None: False)
    assert not finishing.finish_job(job.pk)
    assert _state(job) == ("terminating", "")
    assert sent.messages == [("finish_job", job.pk, finishing.STOP_RECHECK, False)]


@pytest.mark.step_case("finish_job", "stale")
def test_finish_with_a_stale_lease_keeps_the_job_and_its_host(sent, monkeypatch):
    (job,) = _jobs(sent, status="terminating", termination_reason="done_by_runner")
    around_body(monkeypatch, finishing, "_finish", steal(Job))
    assert not finishing.finish_job(job.pk)
    assert _state(job) == ("terminating", "someone-else")
    assert Instance.objects.get(pk=job.instance_id).status == "busy", "the new holder hands the host back"


@pytest.mark.step_case("finish_job", "contention")
def test_finish_does_nothing_while_another_worker_holds_the_job(sent):
    (job,) = _jobs(sent, status="terminating", termination_reason="done_by_runner")
    token = claims.claim(Job, job.pk)
    assert not finishing.finish_job(job.pk)
    assert _state(job) == ("terminating", token)
    claims.forget_all()
