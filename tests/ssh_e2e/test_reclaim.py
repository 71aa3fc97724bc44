"""Reclaim on a shared fleet (engine/submitted/reclaim.py, docs/queueing.md "Reclaim") through the
REST API with a real worker on real sshd hosts in network namespaces: project alpha owns fleet
`pool` of 4 hosts, shared with beta, each with a nominal quota of 2 hosts and leave to borrow 2. A
run of a project owed its quota stops a preemptible run of the project that borrowed the hosts (with
its grace, as an interruption its retry brings back); a borrower's run that is not preemptible is
never touched; and priority never crosses projects: a priority-100 run of beta neither stops
alpha's preemptible runs within alpha's quota nor passes alpha's older run when freed hosts leave
both projects level."""

from __future__ import annotations

import json
import time

import pytest

from events.models import Event
from runs.models import Run
from runs.services import logs
from tests.engine.helpers import wait_for_run
from tests.ssh_e2e.helpers import needs_netns, netns_pool
from tests.ssh_e2e.test_shared_fleets import (  # noqa: F401 - `projects` is the fixture
    _placed,
    _register,
    _share,
    _stop,
    _submit,
    _waiting_for,
    projects,
)
from tests.waiting import wait_until

pytestmark = [*needs_netns, pytest.mark.django_db(transaction=True), pytest.mark.slow]

pool = netns_pool(4)

# On SIGTERM it takes 7 s to finish: within its 15 s stop_duration, past the runner's own 5 s default.
LENT = ("type: task\nname: {name}\nnodes: {nodes}\nfleets: [{fleet}]\npreemptible: {preemptible}\n"
        "stop_duration: 15s\npriority: {priority}\n"
        "commands:\n  - trap 'sleep 7; exit 0' TERM\n  - echo trapped\n  - sleep 600 & wait\n"
        "retry: {{on_events: [interruption, no-capacity], duration: 30m}}\n")


def _apply(api, project: str, text: str) -> None:
    answer = api.post(f"/api/projects/{project}/runs/", {"configuration": text}, format="json")
    assert answer.status_code == 201, answer.content


def _lent(api, project: str, name: str, fleet: str, nodes: int = 1, preemptible: bool = True,
          priority: int = 0) -> None:
    _apply(api, project, LENT.format(name=name, nodes=nodes, fleet=fleet, priority=priority,
                                     preemptible="true" if preemptible else "false"))


def _messages(project: str, run: str) -> list[str]:
    return list(Event.objects.filter(run__project__name=project, run__name=run).order_by("pk")
                .values_list("message", flat=True))


def _seen_by(api, project: str) -> str:
    return json.dumps({path: api.get(f"/api/projects/{project}/{path}").json()
                       for path in ("runs/", "events/", "queue/", "fleets/", "instances/")})


def _pool_conf(pool_hosts) -> dict:
    both = {"quota": {"hosts": 2}, "borrowing_limit": {"hosts": 2}}
    return _share(pool_hosts, **both, shared_with=[{"project": "beta", **both}])


def test_a_project_owed_its_quota_reclaims_a_borrowers_preemptible_run_which_gets_its_grace_and_comes_back(
        projects, pool):  # noqa: F811
    alpha, beta = projects["alpha"], projects["beta"]
    _register(alpha, _pool_conf(pool))
    # beta holds 4 of its 2 hosts: keep-1 (preemptible) and keep-2 within its quota, lent-run borrowing 2
    _lent(beta, "beta", "keep-1", "alpha/pool")
    _submit(beta, "beta", "keep-2", "alpha/pool")
    for name in ("keep-1", "keep-2"):
        wait_for_run(name, statuses=("running",), timeout=120, project="beta")
    _lent(beta, "beta", "lent-run", "alpha/pool", nodes=2)
    lent = wait_for_run("lent-run", statuses=("running",), timeout=120, project="beta")
    # "running" comes when the runner has started the commands, maybe before the trap is set: a stop
    # signal then would end a job at once, with no grace to measure
    wait_until(lambda: all("trapped" in logs.read(job).decode() for job in lent.current_jobs()), timeout=60,
               what="lent-run's jobs to set their TERM trap")

    # alpha holds nothing of its 2: its 2-node run is owed them, and beta holds 2 above its quota
    started = time.monotonic()
    _apply(alpha, "alpha", LENT.format(name="owed-run", nodes=2, fleet="pool", priority=0, preemptible="false"))
    said = _waiting_for(alpha, "alpha", "owed-run", "a free host: fleet pool is full; reclaiming")
    assert said.endswith("reclaiming 2 hosts lent to other projects"), said
    wait_for_run("owed-run", statuses=("running",), timeout=120, project="alpha")
    took = time.monotonic() - started
    assert took >= 6, f"owed-run was placed {took:.1f}s after it came: before lent-run's jobs ended their grace"

    lent = Run.objects.get(project__name="beta", name="lent-run")
    first = list(lent.jobs.filter(submission_num=0).order_by("job_num"))
    assert [(j.status, j.termination_reason) for j in first] == [("failed", "preempted")] * 2, first
    said = set(Event.objects.filter(run=lent, message__startswith="reclaimed by").values_list("message", flat=True))
    stopped = Event.objects.filter(run=lent, message__startswith="reclaimed by").order_by("pk").first()
    assert said == {"reclaimed by project alpha (its quota on fleet alpha/pool): its jobs get the stop "
                    "signal and 15s to end"}, said
    for job in first:  # the stop signal, then the trap's 7 s within its 15 s grace
        assert job.end_time - stopped.created.timestamp() >= 6, job.end_time - stopped.created.timestamp()
    assert any(m == "reclaims 2 hosts of fleet pool lent to other projects: their preemptible runs get the stop "
               "signal" for m in _messages("alpha", "owed-run")), _messages("alpha", "owed-run")
    # whole runs, the fewest, never below beta's quota: keep-1 (preemptible too) and keep-2 untouched
    for name in ("keep-1", "keep-2"):
        run = Run.objects.get(project__name="beta", name=name)
        assert run.status == "running" and not run.stop_requested and run.submission_num == 0, name
    # isolation: neither project's answers name the other's run
    assert "owed-run" not in _seen_by(beta, "beta") and "owed-run" not in json.dumps(_messages("beta", "lent-run"))
    assert "lent-run" not in _seen_by(alpha, "alpha")
    assert not any("lent-run" in m or "keep-" in m for m in _messages("alpha", "owed-run"))

    # an interruption: lent-run's retry resubmits it; it waits (beta is at its quota, nothing idle) ...
    wait_until(lambda: any("after preempted of job" in m for m in _messages("beta", "lent-run")), timeout=60,
               what="lent-run to retry after its preemption")
    _waiting_for(beta, "beta", "lent-run", "a free host")
    # ... and comes back once alpha gives the hosts back
    _stop(alpha, "alpha", "owed-run")
    lent = wait_for_run("lent-run", statuses=("running",), timeout=120, project="beta")
    assert lent.submission_num >= 1
    _stop(beta, "beta", "keep-1", "keep-2", "lent-run")


def test_a_borrowers_run_that_is_not_preemptible_is_never_reclaimed(projects, pool):  # noqa: F811
    alpha, beta = projects["alpha"], projects["beta"]
    _register(alpha, _pool_conf(pool))
    for name in ("b1", "b2"):
        _submit(beta, "beta", name, "alpha/pool")
    _lent(beta, "beta", "big", "alpha/pool", nodes=2, preemptible=False)
    for name in ("b1", "b2", "big"):
        wait_for_run(name, statuses=("running",), timeout=120, project="beta")
    _submit(alpha, "alpha", "owed", "pool")
    said = _waiting_for(alpha, "alpha", "owed", "a free host: fleet pool is full")
    assert "reclaim" not in said, said
    time.sleep(3)  # a look or two more
    big = Run.objects.get(project__name="beta", name="big")
    assert big.status == "running" and not big.stop_requested
    assert not Event.objects.filter(message__contains="reclaim").exists()
    _stop(beta, "beta", "big")  # given back: alpha, furthest below its share, gets it
    wait_for_run("owed", statuses=("running",), timeout=120, project="alpha")
    _stop(alpha, "alpha", "owed")
    _stop(beta, "beta", "b1", "b2")


def test_priority_never_crosses_projects(projects, pool):  # noqa: F811
    alpha, beta = projects["alpha"], projects["beta"]
    _register(alpha, _pool_conf(pool))
    # alpha's preemptible priority-0 runs within its quota; beta's runs within its own
    for name in ("a1", "a2"):
        _lent(alpha, "alpha", name, "pool")
    for name in ("b1", "b2"):
        _submit(beta, "beta", name, "alpha/pool")
    for project, name in (("alpha", "a1"), ("alpha", "a2"), ("beta", "b1"), ("beta", "b2")):
        wait_for_run(name, statuses=("running",), timeout=120, project=project)
    # alpha's 2-node run, then beta's 2-node run at the top priority: both past their quotas, both wait
    _lent(alpha, "alpha", "a3", "pool", nodes=2, preemptible=False)
    _waiting_for(alpha, "alpha", "a3", "a free host: quota:")
    _lent(beta, "beta", "jump", "alpha/pool", nodes=2, preemptible=False, priority=100)
    said = _waiting_for(beta, "beta", "jump", "a free host: quota:")
    assert "stopping" not in said and "reclaim" not in said, said
    time.sleep(3)  # a look or two more: priority 100 takes nothing of alpha's
    for name in ("a1", "a2"):
        run = Run.objects.get(project__name="alpha", name=name)
        assert run.status == "running" and not run.stop_requested, name
    assert not Event.objects.filter(message__contains="preempt").exists()
    assert not Event.objects.filter(message__contains="reclaim").exists()

    # one host of each back: both projects hold 1 of 2, level; both runs fit (each may borrow the
    # other's idle one); the older, alpha's a3, goes first whatever jump's priority
    _stop(alpha, "alpha", "a1")
    _stop(beta, "beta", "b1")
    wait_for_run("a3", statuses=("running",), timeout=120, project="alpha")
    time.sleep(2)
    assert not _placed("beta", "jump")
    _stop(alpha, "alpha", "a2", "a3")
    _stop(beta, "beta", "jump", "b2")
