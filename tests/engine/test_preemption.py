"""Preemption within a project's fleet (engine/submitted/preemption.py), through the CLI and the REST
API with a live server, a real worker and real local runners: a priority-90 run that finds the fleet
full stops a preemptible priority-10 run holding the hosts, which gets its stop signal and its
`stop_duration` as grace, ends as an interruption and comes back by its `retry` once hosts free; a
run that is not preemptible is never touched."""

from __future__ import annotations

import time

import pytest

from events.models import Event
from runs.models import Run
from tests.engine.helpers import local_project_fleet, wait_for_run
from tests.engine.test_priority_queue import muster  # noqa: F401 - the fixture
from tests.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

# On SIGTERM it takes 7 s to finish, then says so: past the runner's own 5 s default, within its 15 s
# stop_duration. `sleep & wait` so the trap runs as soon as the signal comes; the marker after the
# trap, so a test that waits for it never signals a job that has no trap yet.
LOW = ("type: task\nname: low\nnodes: 2\npriority: 10\npreemptible: {preemptible}\nstop_duration: 15s\n"
       "commands:\n  - trap 'sleep 7; echo graceful >> {marker}.$DSTACK_NODE_RANK; exit 0' TERM\n"
       "  - echo attempt >> {marker}.$DSTACK_NODE_RANK\n"
       "  - sleep 347 & wait\n"
       "retry: {{on_events: [interruption, no-capacity], duration: 10m}}\n")
HIGH = ("type: task\nname: high\nnodes: 2\npriority: 90\ncommands: [sleep 3]\n"
        "retry: {on_events: [no-capacity], duration: 10m}\n")


def _messages(run: str) -> list[str]:
    return list(Event.objects.filter(run__name=run).order_by("pk").values_list("message", flat=True))


def test_a_higher_priority_run_preempts_a_preemptible_one_which_gets_its_grace_and_comes_back_by_retry(
        muster, tmp_path):  # noqa: F811
    local_project_fleet(size=2)
    marker = tmp_path / "low"
    muster.apply("low", LOW.format(preemptible="true", marker=marker))
    wait_until(lambda: all((tmp_path / f"low.{n}").exists() for n in (0, 1)), timeout=90, what="low to run")
    started = time.monotonic()
    muster.apply("high", HIGH)

    high = wait_for_run("high", statuses=("running", "done"), timeout=120)
    took = time.monotonic() - started
    assert took >= 7, f"high was placed {took:.1f}s after it came: before low's jobs ended their grace"
    for n in (0, 1):  # the stop signal, then the grace of stop_duration (15 s), not the runner's 5 s default
        assert (tmp_path / f"low.{n}").read_text().splitlines()[:2] == ["attempt", "graceful"], n
    low = Run.objects.get(name="low")
    first = low.jobs.filter(submission_num=0).order_by("job_num")
    assert [(j.status, j.termination_reason) for j in first] == [("failed", "preempted")] * 2
    assert any(m.startswith("preempts run low (priority 10, preemptible) for 2 hosts of fleet local")
               for m in _messages("high")), _messages("high")
    assert any(m.startswith("preempted by run high (priority 90)") for m in _messages("low")), _messages("low")
    assert any("after preempted of job" in m for m in _messages("low")), "low retries: an interruption"

    high = wait_for_run("high", timeout=90)
    assert high.status == "done"
    wait_until(lambda: all((tmp_path / f"low.{n}").read_text().count("attempt") == 2 for n in (0, 1)),
               timeout=90, what="low to come back by its retry once high gave the hosts back")
    low = wait_for_run("low", statuses=("running",), timeout=30)
    assert low.submission_num >= 1
    api = muster.api.get("/api/projects/main/runs/low/").json()
    assert api["status"] == "running", api
    assert muster("stop", "low", "-y").returncode == 0
    wait_for_run("low", timeout=90)


def test_a_run_that_is_not_preemptible_is_never_touched(muster, tmp_path):  # noqa: F811
    local_project_fleet(size=2)
    marker = tmp_path / "low"
    muster.apply("low", LOW.format(preemptible="false", marker=marker))
    wait_until(lambda: all((tmp_path / f"low.{n}").exists() for n in (0, 1)), timeout=90, what="low to run")
    muster.apply("high", HIGH)
    wait_until(lambda: muster.api.get("/api/projects/main/runs/high/").json()["waiting_for"].startswith("a free host"),
               timeout=60, what="high to wait")
    time.sleep(3)  # a look or two more by the waiting run
    low = Run.objects.get(name="low")
    assert low.status == "running" and not low.stop_requested, low.status
    assert [j.status for j in low.current_jobs()] == ["running", "running"]
    assert not any("preempt" in m for m in _messages("low") + _messages("high"))
    assert Run.objects.get(name="high").status == "submitted"
    assert muster("stop", "low", "-y").returncode == 0
    wait_for_run("high", statuses=("running", "done"), timeout=90)


def test_a_preemptible_run_that_ignores_its_stop_signal_is_killed_after_its_grace(muster, tmp_path):  # noqa: F811
    local_project_fleet(size=2)
    deaf = ("type: task\nname: deaf\nnodes: 2\npriority: 10\npreemptible: true\nstop_duration: 4s\n"
            f"commands:\n  - trap '' TERM\n  - touch {tmp_path}/deaf.$DSTACK_NODE_RANK\n"
            "  - while true; do sleep 1; done\n")
    muster.apply("deaf", deaf)
    wait_until(lambda: all((tmp_path / f"deaf.{n}").exists() for n in (0, 1)), timeout=90, what="deaf to run")
    muster.apply("high", HIGH)
    high = wait_for_run("high", statuses=("running", "done"), timeout=120)
    deaf_run = wait_for_run("deaf", timeout=60)
    assert deaf_run.status == "failed", "no retry: a preempted run without one fails"
    jobs = list(deaf_run.current_jobs())
    assert [(j.status, j.termination_reason) for j in jobs] == [("failed", "preempted")] * 2
    stopped = Event.objects.filter(run__name="deaf", message__startswith="preempted by run high").first()
    for job in jobs:  # SIGTERM ignored: SIGKILL once its 4 s grace was over, not held for the default 5 minutes
        took = job.end_time - stopped.created.timestamp()
        assert 3.5 <= took <= 60, took
    assert high.status in ("running", "done")
