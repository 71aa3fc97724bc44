"""When a job's end nudges its run (process_run), and when it does not.

A job that ends without a failure can change its run only once it is the last of the run's
current jobs to end, so the others' ends send nothing (engine.nudges.matters_only_last): a
4-node run is derived once at its end, not four times. Whatever can change the run on its own
still nudges at once: a failure, the master of a `master-done` run, a job of a run whose groups
restart. Jobs that end together each look after their own commit, so at least one of them sends.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from engine import finishing, sweeps
from instances.models import Instance
from instances.services.fleets import create_local_fleet
from projects.models import Project
from runs import transitions
from runs.models import Job, Run
from runs.services.submission import submit_run
from tests.engine.helpers import local_project_fleet

pytestmark = pytest.mark.django_db(transaction=True)


def _running_run(sent, nodes: int, name: str = "nudges", project=None) -> list[Job]:
    """A run whose jobs all run on hosts of a local fleet (the runner is not asked: not submitted)."""
    if project is None:
        fleet = local_project_fleet(size=nodes, name=f"fleet-{name}")
    else:
        fleet = create_local_fleet(project, f"fleet-{name}", nodes, placement="cluster")
    run = submit_run(fleet.project, None, {"configuration": f"type: task\nname: {name}\nnodes: {nodes}\n"
                                                            "commands: [echo]\n"})
    hosts = list(fleet.instances.order_by("index"))
    Run.objects.filter(pk=run.pk).update(status="running", fleet=fleet)
    for job, host in zip(run.current_jobs().order_by("job_num"), hosts, strict=True):
        Instance.objects.filter(pk=host.pk).update(status="busy")
        Job.objects.filter(pk=job.pk).update(status="running", instance=host, waiting_master_job=False,
                                             status_changed_at=timezone.now())
    sent.clear()
    return list(run.current_jobs().order_by("job_num"))


def _ending(job: Job, reason: str = "done_by_runner") -> None:
    Job.objects.filter(pk=job.pk).update(status="terminating", termination_reason=reason,
                                         status_changed_at=timezone.now())


def test_only_the_last_job_of_a_run_to_end_nudges_it(sent):
    jobs = _running_run(sent, 3)
    for job in jobs[:2]:
        _ending(job)
        assert finishing.finish_job(job.pk)
        assert sent.names() == [], "the run still has a running job: nothing for process_run to do"
    _ending(jobs[2])
    assert finishing.finish_job(jobs[2].pk)
    assert sent.names() == [("process_run", jobs[0].run_id)]


def test_a_failed_job_nudges_its_run_while_the_others_still_run(sent):
    jobs = _running_run(sent, 2)
    _ending(jobs[1], "process_exited_with_error")
    assert finishing.finish_job(jobs[1].pk)
    assert Job.objects.get(pk=jobs[1].pk).status == "failed"
    assert sent.names() == [("process_run", jobs[0].run_id)], "one failed node ends the whole run"


def test_the_master_of_a_master_done_run_nudges_it_while_the_others_still_run(sent):
    jobs = _running_run(sent, 2)
    run = jobs[0].run
    Run.objects.filter(pk=run.pk).update(configuration={**run.configuration, "stop_criteria": "master-done"})
    _ending(jobs[1])
    assert finishing.finish_job(jobs[1].pk)
    assert sent.names() == [], "a worker's end does not end a master-done run"
    _ending(jobs[0])
    assert finishing.finish_job(jobs[0].pk)
    assert sent.names() == [("process_run", run.pk)]


def test_a_job_of_a_restarting_run_nudges_it_while_other_groups_run(sent):
    jobs = _running_run(sent, 2)
    due = (timezone.now() + timedelta(seconds=15)).isoformat()
    Run.objects.filter(pk=jobs[0].run_id).update(restarts={"0": {"count": 1, "submission": 0, "due": due}})
    _ending(jobs[1], "terminated_by_server")
    assert finishing.finish_job(jobs[1].pk)
    assert sent.names() == [("process_run", jobs[0].run_id)], "the restart's next pass may be due"


def test_another_tenants_run_with_the_same_name_does_not_hold_the_nudge_back(sent):
    mine = _running_run(sent, 1, name="same")
    _running_run(sent, 2, name="same", project=Project.objects.create(name="other"))
    _ending(mine[0])
    assert finishing.finish_job(mine[0].pk)
    assert sent.names() == [("process_run", mine[0].run_id)]


def _end_together(monkeypatch, jobs: list[Job]) -> list[bool]:
    """finish_job of each job in its own thread, every job's move written before any commits."""
    barrier = threading.Barrier(len(jobs), timeout=20)
    original = transitions.update_row_and_record

    def written_then_wait(*args, **kwargs):
        touched = original(*args, **kwargs)
        if args[0] is Job:
            barrier.wait()
        return touched

    ended, errors = [], []

    def finish(pk):
        try:
            ended.append(finishing.finish_job(pk))
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)
        finally:
            connection.close()

    with monkeypatch.context() as patched:
        patched.setattr(transitions, "update_row_and_record", written_then_wait)
        threads = [threading.Thread(target=finish, args=(j.pk,)) for j in jobs]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    assert not errors, errors
    return ended


@pytest.mark.skipif(connection.vendor != "postgresql",
                    reason="two writers at once: SQLite makes the second wait for the first's commit")
def test_jobs_that_end_together_still_nudge_their_run(sent, monkeypatch):
    """Both moves are written before either commits (a barrier after each UPDATE): a check inside
    the transaction would see the other job unfinished in both and nobody would send."""
    for attempt in range(3):
        jobs = _running_run(sent, 2, name=f"together-{attempt}")
        for job in jobs:
            _ending(job)
        assert _end_together(monkeypatch, jobs) == [True, True]
        nudges = [pk for name, pk in sent.names() if name == "process_run"]
        assert nudges and set(nudges) == {jobs[0].run_id}, sent.names()


def test_the_sweep_counts_a_run_left_running_after_an_early_end_as_routine(sent):
    jobs = _running_run(sent, 2)
    _ending(jobs[0])
    assert finishing.finish_job(jobs[0].pk)
    long_ago = timezone.now() - timedelta(hours=1)
    Job.objects.filter(pk=jobs[0].pk).update(status_changed_at=long_ago)
    Run.objects.filter(pk=jobs[0].run_id).update(derived_at=long_ago - timedelta(minutes=1))
    runs = sweeps.runs_to_derive(timezone.now(), timezone.now() - timedelta(seconds=30))
    lost, routine, _ = sweeps._runs_by_why(runs, sweeps.changed_statuses(runs, timezone.now() - timedelta(seconds=30)))
    assert jobs[0].run_id in routine and jobs[0].run_id not in lost, "no nudge was owed, none was lost"
    # once every job has ended, the last end owed one: a run not derived after it lost its nudge
    Job.objects.filter(pk=jobs[1].pk).update(status="done", status_changed_at=long_ago)
    runs = sweeps.runs_to_derive(timezone.now(), timezone.now() - timedelta(seconds=30))
    lost, routine, _ = sweeps._runs_by_why(runs, sweeps.changed_statuses(runs, timezone.now() - timedelta(seconds=30)))
    assert jobs[0].run_id in lost


def test_a_run_its_derive_fails_outright_is_not_derived_again(sent):
    """No capacity: job 0 fails, the derive ends the never-started others and fails the run in one
    step. Their ends look after commit, find the run finished, and send nothing (process_run could
    not claim a finished run: each would be a task for nothing)."""
    from engine.processing import process_run
    from engine.submitted.provision import provision_job

    fleet = local_project_fleet(size=2, name="fleet-nocap")
    run = submit_run(fleet.project, None, {"configuration": "type: task\nnodes: 4\ncommands: [echo]\nretry: false\n"})
    sent.clear()
    assert provision_job(run.current_jobs().get(job_num=0).pk)
    assert sent.names() == [("process_run", run.pk)], "a failure nudges its run at once"
    sent.clear()
    assert process_run(run.pk)
    run.refresh_from_db()
    assert run.status == "failed" and run.termination_reason == "job_failed"
    assert sorted(run.current_jobs().values_list("job_num", "status")) == [
        (0, "failed"), (1, "terminated"), (2, "terminated"), (3, "terminated")]
    assert sent.names() == []


def test_a_teardown_leaves_a_job_that_moved_since_its_read_to_the_next_derive(sent):
    """The teardown ends the jobs as the derive read them; a member placed in between (its master's
    batch) is not moved by that stale copy, is counted as still active, and the run is not finished
    past it. The other never-started member ends, with its event."""
    jobs = _running_run(sent, 3, name="moved")
    Job.objects.filter(pk__in=[jobs[1].pk, jobs[2].pk]).update(status="submitted", instance=None)
    stale = list(Run.objects.get(pk=jobs[0].run_id).current_jobs().order_by("job_num"))
    for job in stale:
        job.run = jobs[0].run
    Job.objects.filter(pk=jobs[2].pk).update(status="provisioning", instance=jobs[2].instance_id)
    assert finishing.end_active_jobs(jobs[0].run, "terminated_by_server", jobs=stale) == 2
    assert [Job.objects.get(pk=j.pk).status for j in jobs] == ["terminating", "terminated", "provisioning"]
    assert list(jobs[1].events.values_list("subject", "status")) == [("job moved/1", "terminated")]
    assert not jobs[2].events.filter(status="terminated").exists()


def test_the_sweep_does_not_derive_a_run_never_derived_whose_jobs_all_wait(sent):
    """A waiting run's job stays `submitted`: its derive would change nothing, and at 10,000 waiting
    runs the sweep spent one process_run on each (bench.queueing). Once a job of it moves, it is due."""
    fleet = local_project_fleet(size=1, name="fleet-waits")
    run = submit_run(fleet.project, None, {"configuration": "type: task\nname: waits\nnodes: 2\ncommands: [echo]\n"})
    long_ago = timezone.now() - timedelta(hours=1)
    Run.objects.filter(pk=run.pk).update(submitted_at=long_ago - timedelta(minutes=1))
    Job.objects.filter(run=run).update(status_changed_at=long_ago, waiting_for="a free host: fleet is full")

    def due() -> list[int]:
        return [pk for pk, _, _ in sweeps.runs_to_derive(timezone.now(), timezone.now() - timedelta(seconds=30))]

    assert run.pk not in due()
    Job.objects.filter(run=run, job_num=1).update(status="terminated", termination_reason="failed_to_start_due_to_no_capacity")
    assert run.pk in due(), "a job that left `submitted` makes the never-derived run due"
    Job.objects.filter(run=run, job_num=1).update(status="submitted")
    Run.objects.filter(pk=run.pk).update(derived_at=long_ago - timedelta(seconds=30))
    assert run.pk in due(), "a derived run is due by its jobs' changes since, whatever their status"
