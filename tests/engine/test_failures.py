"""Each way a run can fail ends in a job reason, a torn-down run and nothing left busy."""

from __future__ import annotations

import pytest

from instances.models import Instance
from runs.services.submission import submit_run
from runs.transitions import request_stop
from tests.engine.helpers import Beat, job_summary, local_project_fleet, runner_processes, wait_for_run
from tests.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _run(fleet, conf: str, timeout: float = 60, statuses=("done", "failed", "terminated")):
    with Beat():
        run = submit_run(fleet.project, None, {"configuration": conf})
        return wait_for_run(run.name, timeout=timeout, statuses=statuses)


def _nothing_busy():
    return not Instance.objects.filter(status="busy").exists()


def test_no_fleet_that_fits_fails_with_no_capacity(fast_limits, celery_worker):
    fleet = local_project_fleet(size=2)
    run = _run(fleet, "type: task\nname: too-big\nnodes: 3\ncommands: [echo]\n")
    assert run.status == "failed" and run.termination_reason == "job_failed"
    assert [r for _, _, r in job_summary(run)] == ["failed_to_start_due_to_no_capacity",
                                                   "terminated_by_server", "terminated_by_server"]
    assert _nothing_busy()


def test_no_capacity_with_retry_resubmits_until_the_duration_then_gives_up(fast_limits, celery_worker):
    fleet = local_project_fleet(size=1)
    conf = ("type: task\nname: retrying\nnodes: 2\ncommands: [echo]\n"
            "retry: {on_events: [no-capacity], duration: 4s}\n")
    run = _run(fleet, conf, timeout=40)
    assert run.status == "failed"
    assert run.termination_reason == "retry_limit_exceeded"
    assert run.submission_num >= 1, "the run was resubmitted at least once"
    from events.models import Event

    assert Event.objects.filter(run=run, status="pending").count() == run.submission_num
    assert run.jobs.count() == 2 * (run.submission_num + 1), "old submissions stay as history"
    assert _nothing_busy()


def test_a_failing_command_fails_the_run_and_stops_the_other_node(fast_limits, celery_worker):
    fleet = local_project_fleet(size=2)
    conf = ('type: task\nname: bad-exit\nnodes: 2\ncommands:\n'
            '  - if [ "$DSTACK_NODE_RANK" = 1 ]; then exit 3; else sleep 317; fi\n')
    run = _run(fleet, conf)
    assert run.status == "failed" and run.termination_reason == "job_failed"
    master, worker = run.current_jobs()
    assert (worker.status, worker.termination_reason, worker.exit_status) == ("failed", "process_exited_with_error", 3)
    assert master.termination_reason == "terminated_by_server"
    assert runner_processes("sleep 317") == []
    assert _nothing_busy()


def test_max_duration_stops_a_job_that_runs_too_long(fast_limits, celery_worker):
    fleet = local_project_fleet(size=1)
    run = _run(fleet, "type: task\nname: too-long\nmax_duration: 2s\ncommands: [sleep 319]\n")
    (job,) = run.current_jobs()
    assert job.termination_reason == "max_duration_exceeded"
    assert run.status == "failed"
    assert runner_processes("sleep 319") == []
    assert _nothing_busy()


def _break_runner(instance: Instance) -> None:
    """Point the instance's runner home under a regular file, so no agent can ever start there."""
    from django.conf import settings

    blocker = settings.MUSTER["LOCAL_DIR"] / f"blocker-{instance.pk}"
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_text("not a directory")
    Instance.objects.filter(pk=instance.pk).update(backend_data={"home": str(blocker / "muster")})


def test_a_runner_that_never_comes_up_fails_with_waiting_runner_limit(fast_limits, celery_worker, settings):
    settings.MUSTER = {**settings.MUSTER, "WAITING_RUNNER_LIMIT": 2}
    fleet = local_project_fleet(size=2)
    _break_runner(fleet.instances.order_by("name").last())
    run = _run(fleet, "type: task\nname: no-runner\nnodes: 2\ncommands: [sleep 1]\n")
    reasons = {r for _, _, r in job_summary(run)}
    assert run.status == "failed"
    assert "waiting_runner_limit_exceeded" in reasons
    assert _nothing_busy()


def test_waiting_for_peers_has_its_own_limit(fast_limits, celery_worker, settings):
    # The worker's runner never comes up (long runner limit), so under workers-first the master
    # waits for it on the peers' clock, which is much shorter here.
    settings.MUSTER = {**settings.MUSTER, "WAITING_RUNNER_LIMIT": 30, "WAITING_PEERS_LIMIT": 2}
    fleet = local_project_fleet(size=2)
    _break_runner(fleet.instances.order_by("name").last())
    conf = "type: task\nname: no-peers\nnodes: 2\nstartup_order: workers-first\ncommands: [sleep 1]\n"
    run = _run(fleet, conf)
    master, worker = run.current_jobs()
    assert master.termination_reason == "waiting_peers_limit_exceeded"
    assert run.status == "failed"
    assert _nothing_busy()


def _commands(command: str) -> list[int]:
    """Pids of live processes running exactly `command` (not a shell whose script contains it)."""
    found = []
    for pid in runner_processes(command):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().rstrip(b"\0").split(b"\0") == command.encode().split():
                    found.append(pid)
        except OSError:
            continue
    return found


@pytest.mark.parametrize("abort", [False, True])
def test_a_user_can_stop_or_abort_a_running_run(abort, fast_limits, celery_worker):
    fleet = local_project_fleet(size=2)
    with Beat():
        run = submit_run(fleet.project, None, {"configuration": "type: task\nname: stoppable\nnodes: 2\n"
                                                                "commands: [sleep 331]\n"})
        wait_for_run(run.name, statuses=("running",), timeout=30)
        # the sleeps themselves: a node's shell (`sh -c "set -e\nsleep 331"`) may or may not exec its last command
        wait_until(lambda: len(_commands("sleep 331")) == 2, timeout=60, what="both nodes' commands running")
        request_stop(run, abort=abort, actor="tester")
        run = wait_for_run(run.name, timeout=30)
    assert run.status == "terminated"
    assert run.termination_reason == ("aborted_by_user" if abort else "stopped_by_user")
    expected = ("aborted", "aborted_by_user") if abort else ("terminated", "terminated_by_user")
    assert {(s, r) for _, s, r in job_summary(run)} == {expected}
    assert runner_processes("sleep 331") == []
    assert _nothing_busy()


def test_a_run_stopped_before_any_worker_picked_it_up_ends_cleanly(fast_limits, celery_worker):
    fleet = local_project_fleet(size=2)
    with Beat():
        from django.db import transaction

        with transaction.atomic():  # stop in the same transaction: no task has seen the run yet
            run = submit_run(fleet.project, None, {"configuration": "type: task\nname: early\nnodes: 2\n"
                                                                    "commands: [echo]\n"})
            request_stop(run, actor="tester")
        run = wait_for_run(run.name, timeout=30)
    assert run.status == "terminated" and run.termination_reason == "stopped_by_user"
    assert all(s == "terminated" for _, s, _ in job_summary(run))
    assert _nothing_busy()
