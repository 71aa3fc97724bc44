"""Every step owns its claim: whatever goes wrong inside it, the row is given back and done later.

Driven through the real worker: a runner that reports nonsense about one job must not stop the
watch of anybody else's, and an unexpected exception inside any kind of step leaves its row due
again after a backoff instead of leased for the life of the worker.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from engine import finishing, processing
from engine.running import observe
from engine.starting import cluster
from engine.submitted import placement
from projects.models import Project
from runs.models import Job
from runs.services.submission import submit_run
from tests.engine.helpers import Beat, job_summary, local_project_fleet, wait_for_run
from tests.waiting import patient

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _until(predicate, timeout: float = 30.0, what: str = "condition"):
    deadline = time.monotonic() + patient(timeout)
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"{what} not met before the deadline")


def _task(name: str, nodes: int, command: str) -> str:
    return f"type: task\nname: {name}\nnodes: {nodes}\ncommands:\n  - {command}\n"


# What a broken runner (or whatever answers in its place) may say about a job it runs.
MALFORMED = {
    "state-not-a-string": {"state": ["running"]},
    "end-time-not-a-number": {"state": "done", "end_time": "later", "exit_status": 0},
    "exit-status-not-a-number": {"state": "failed", "end_time": 1.0, "exit_status": "one"},
}


@pytest.mark.parametrize("status", MALFORMED.values(), ids=list(MALFORMED))
def test_a_malformed_runner_status_on_one_host_leaves_every_other_job_watched(status, fast_limits,
                                                                               celery_worker):
    from instances.services.fleets import create_local_fleet

    main = local_project_fleet(size=3)
    other = create_local_fleet(Project.objects.create(name="other"), "local", 2)
    with Beat():
        victim = submit_run(main.project, None, {"configuration": _task("victim", 1, "sleep 60")})
        near = submit_run(main.project, None, {"configuration": _task("near", 2, "sleep 8")})
        far = submit_run(other.project, None, {"configuration": _task("far", 2, "sleep 8")})
        # every job past its start (on a loaded machine the first ones may be done before the last
        # starts: what counts is that the others are watched while the victim's status is corrupt)
        _until(lambda: victim.current_jobs().filter(status="running").exists()
               and not Job.objects.filter(status__in=("submitted", "provisioning", "pulling")).exists(),
               what="every job started")

        # the victim's runner now says something about its job that the runner never prints
        job = victim.current_jobs().get()
        home = Path(job.instance.backend_data["home"])
        (home / "jobs" / job.runner_job_id / "status.json").write_text(json.dumps(status))

        for run in (near, far):
            done = wait_for_run(run.name, timeout=40, project=run.project.name)
            assert done.status == "done", job_summary(done)
        ended = wait_for_run("victim", timeout=40)
    assert ended.status == "failed", "a host that answers nonsense is treated as one that does not answer"
    assert ended.current_jobs().get().termination_reason == "instance_unreachable"
    assert not Job.objects.exclude(lease_token="").exists(), "no lease outlives its step"


class FailOnce:
    """Wraps a function a step calls: its first call (that `when` picks) raises what no step
    expects; later ones run the function."""

    def __init__(self, function, when=None):
        self.function, self.when = function, when
        self.calls = 0
        self.lock = threading.Lock()

    def __call__(self, *args, **kwargs):
        if self.when is not None and not self.when(*args):
            return self.function(*args, **kwargs)
        with self.lock:
            self.calls += 1
            first = self.calls == 1
        if first:
            raise RuntimeError("an unexpected fault inside the step")
        return self.function(*args, **kwargs)


def _started(job, status) -> bool:
    return job.status == "running"  # advance_job looks at jobs still pulling; the batch at started ones


# step kind -> (module, function the step calls while it holds its row, which calls to fail)
STEPS = {
    "provision_job": (placement, "take_instances", None),
    "advance_job": (cluster, "runner_spec", None),
    "watch_running": (observe, "watch_observed", _started),
    "finish_job": (finishing, "_runner_finished", None),
    "process_run": (processing, "_derive", None),
}


@pytest.mark.parametrize("step", list(STEPS))
def test_an_unexpected_exception_in_a_step_gives_its_claim_back_and_the_row_is_done_later(
        step, fast_limits, celery_worker, monkeypatch):
    module, name, when = STEPS[step]
    fault = FailOnce(getattr(module, name), when)
    monkeypatch.setattr(module, name, fault)
    fleet = local_project_fleet(size=2)
    with Beat():
        # the watch must see the jobs running at least once: on a loaded machine a half-second job
        # can be over before the first watch, and its fault would never be met
        command = "sleep 5" if step == "watch_running" else "sleep 0.5"
        run = submit_run(fleet.project, None, {"configuration": _task(f"fault-{step.replace('_', '-')}", 2,
                                                                      command)})
        done = wait_for_run(run.name, timeout=60)
    assert fault.calls >= 2, "the step failed once and was done again"
    assert done.status == "done", job_summary(done)
    assert not Job.objects.exclude(lease_token="").exists(), "no lease outlives its step"


def test_the_server_knows_every_state_the_runner_ends_a_job_in():
    from engine.running.observe import RUNNER_END_STATES
    from runner import protocol
    from runs.choices import RUNNER_FINAL

    assert set(protocol.FINAL_STATES) == set(RUNNER_FINAL) == set(RUNNER_END_STATES)


# ---- gathered: a batch step's messages sent as a few ---------------------------------------------


def test_gathered_messages_go_in_chunks_once_the_outermost_block_is_over_even_after_an_error(sent):
    from engine import messages

    sizes = {"advance_job": 2, "finish_job": 25, "process_run": 50}
    with pytest.raises(RuntimeError), messages.gathered(sizes):
        for pk in (5, 3, 4, 3):
            messages.advance_job(pk)
        with messages.gathered({"advance_job": 100}):  # nested: the outer block sends
            messages.finish_job(9)
            messages.process_run(7)
        messages.advance_job(8, countdown=2)  # a countdown is not gathered: it leaves at once
        assert sent.messages == [("advance_job", 8, 2, False)]
        raise RuntimeError("the step failed after its commits")
    assert sent.messages == [("advance_job", 8, 2, False), ("advance_jobs", [3, 4], 0, False),
                             ("advance_job", 5, 0, False), ("finish_job", 9, 0, False), ("process_run", 7, 0, False)], \
        "four asks of three rows: sorted, once each, two a message and the lone one as itself; sent despite the error"
    sent.clear()
    messages.finish_job(1)
    assert sent.messages == [("finish_job", 1, 0, False)], "outside a block, a message leaves at once"
