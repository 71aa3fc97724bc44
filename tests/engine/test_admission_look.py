"""The fleet's admission look (engine/admission.py) on rows set up as the engine leaves them: which
waiting jobs the idle hosts go to, that a burst's second look does not wake the same jobs again, and
that a release while a look holds the fleet's row is looked at afterwards. The messages are caught
as they are sent (no worker): what is under test is the choice and the row's counters."""

from __future__ import annotations

import time

import pytest

from engine import admission, claims, messages
from instances.fleet_queue import want
from instances.models import FleetQueue, Instance
from runs.models import Job, Run
from runs.services.submission import submit_run
from tests.engine.helpers import local_project_fleet
from tests.engine.outcome_helpers import around_body, steal

pytestmark = pytest.mark.django_db(transaction=True)

WAITER = "type: task\nname: {name}\nnodes: {nodes}\npriority: {priority}\ncommands: [echo]\n{extra}" \
         "retry: {{on_events: [no-capacity], duration: 1h}}\n"


@pytest.fixture
def sent(monkeypatch):
    got = {"provision": [], "admit": []}
    monkeypatch.setattr(messages, "provision_job", lambda pk: got["provision"].append(pk))
    monkeypatch.setattr(messages, "admit_fleet", lambda pk, countdown=0: got["admit"].append((pk, countdown)))
    return got


def _waiting(fleet, name: str, priority: int, nodes: int = 1, extra: str = "", says: str | None = None) -> int:
    conf = WAITER.format(name=name, nodes=nodes, priority=priority, extra=extra)
    run = submit_run(fleet.project, None, {"configuration": conf})
    Job.objects.filter(run=run).update(waiting_for=f"a free host: fleet {says or fleet.name} is full")
    return run.current_jobs().get(job_num=0).pk


def _idle(fleet, count: int) -> None:
    hosts = list(fleet.instances.order_by("index").values_list("pk", flat=True))
    Instance.objects.filter(pk__in=hosts).update(status="busy")
    Instance.objects.filter(pk__in=hosts[:count]).update(status="idle")


@pytest.mark.step_case("admit_fleet", "success")
def test_idle_hosts_go_to_the_waiting_runs_in_queue_order_and_a_second_look_wakes_the_next(sent):
    fleet = local_project_fleet(size=4)
    _low, high, mid = _waiting(fleet, "low", 10), _waiting(fleet, "high", 90), _waiting(fleet, "mid", 50)
    big = _waiting(fleet, "big", 70, nodes=3)
    sent["provision"].clear()  # the submissions' own messages
    _idle(fleet, 2)
    admission.admit_fleet(fleet.pk)
    assert sent["provision"] == [high, mid], "the highest priorities that fit; big (3 hosts) is passed over"
    admission.admit_fleet(fleet.pk)  # at once, as a burst's next release: nobody placed yet
    assert sent["provision"] == [high, mid], "the promised jobs are not woken again, nor their hosts offered"
    Job.objects.filter(pk__in=[high, mid]).update(waiting_for="", status="provisioning")  # placed
    _idle(fleet, 3)
    admission.admit_fleet(fleet.pk)
    assert sent["provision"] == [high, mid, big], "three idle hosts hold big now, before low"
    row = FleetQueue.objects.get(pk=fleet.pk)
    assert set(map(int, row.promised)) == {big}, "a placed job's promise is dropped"


def test_a_woken_job_that_did_not_fit_is_passed_over_until_its_recheck(sent):
    fleet = local_project_fleet(size=2)
    first, second = _waiting(fleet, "first", 50), _waiting(fleet, "second", 10)
    sent["provision"].clear()
    _idle(fleet, 1)
    admission.admit_fleet(fleet.pk)
    assert sent["provision"] == [first]
    row = FleetQueue.objects.get(pk=fleet.pk)
    FleetQueue.objects.filter(pk=fleet.pk).update(promised={str(first): time.time() - 30})  # still waiting, past its promise
    assert row.promised
    admission.admit_fleet(fleet.pk)
    assert sent["provision"] == [first, second], "the host goes to the next run, not to the one it did not fit"


def test_a_release_while_a_look_holds_the_row_is_looked_at_afterwards(sent, monkeypatch):
    fleet = local_project_fleet(size=2)
    _idle(fleet, 0)
    admission.admit_fleet(fleet.pk)  # the row is made; nothing to do
    sent["admit"].clear()
    original = admission._admit

    def look_with_a_release_meanwhile(held):
        looked = original(held)
        admission.released([fleet.pk])  # after the look read the row, before it is given back
        return looked

    monkeypatch.setattr(admission, "_admit", look_with_a_release_meanwhile)
    token_holder = claims.claimed(FleetQueue, fleet.pk, "admit_fleet", admission._admit)
    assert token_holder is not None
    assert sent["admit"] == [(fleet.pk, 0)], "the release sends nothing while the row is held; the look sends itself again"
    row = FleetQueue.objects.get(pk=fleet.pk)
    assert row.wanted == row.admitted + 1, "the look started before the release: it is still to be looked at"


@pytest.mark.step_case("admit_fleet", "eligibility")
def test_a_look_on_a_fleet_that_is_gone_does_nothing(sent):
    fleet = local_project_fleet(size=1)
    want([fleet.pk])
    fleet.delete()
    admission.admit_fleet(fleet.pk)
    assert sent == {"provision": [], "admit": []}
    assert not Run.objects.exists() and not FleetQueue.objects.exists()


@pytest.mark.step_case("admit_fleet", "stale")
def test_a_look_whose_lease_was_lost_wakes_nobody_and_writes_nothing(sent, monkeypatch):
    fleet = local_project_fleet(size=2)
    _waiting(fleet, "waiter", 50)
    sent["provision"].clear()
    _idle(fleet, 1)
    want([fleet.pk])
    around_body(monkeypatch, admission, "_admit", steal(FleetQueue))
    admission.admit_fleet(fleet.pk)
    row = FleetQueue.objects.get(pk=fleet.pk)
    assert sent["provision"] == [], "its wakes go with its outcome, dropped with it"
    assert (row.lease_token, row.admitted, row.promised) == ("someone-else", 0, {})


@pytest.mark.step_case("admit_fleet", "contention")
def test_a_look_does_nothing_while_another_worker_holds_the_fleet_s_row(sent):
    fleet = local_project_fleet(size=2)
    _waiting(fleet, "waiter", 50)
    sent["provision"].clear()
    _idle(fleet, 1)
    want([fleet.pk])
    token = claims.claim(FleetQueue, fleet.pk)
    admission.admit_fleet(fleet.pk)
    assert sent["provision"] == [] and FleetQueue.objects.get(pk=fleet.pk).lease_token == token
    claims.forget_all()


def test_a_run_that_may_use_several_fleets_is_woken_by_any_of_them(sent):
    a = local_project_fleet(size=1, name="a")
    b = local_project_fleet(size=1, name="b")
    anywhere = _waiting(a, "anywhere", 10, says="a")  # no `fleets:`: its wait names the first that would hold it
    only_a = [_waiting(a, f"only-a-{i}", 90, extra="fleets: [a]\n") for i in range(3)]
    sent["provision"].clear()
    _idle(a, 0)
    _idle(b, 1)
    admission.admit_fleet(b.pk)
    assert sent["provision"] == [anywhere], f"b's host goes to the run that may use b, past {only_a} (only a)"


def test_a_woken_job_s_promise_counts_while_its_placement_holds_it(sent):
    fleet = local_project_fleet(size=2)
    high = _waiting(fleet, "high", 90, nodes=2)
    low = _waiting(fleet, "low", 10, nodes=2)
    sent["provision"].clear()
    _idle(fleet, 2)
    admission.admit_fleet(fleet.pk)
    assert sent["provision"] == [high]
    token = claims.claim(Job, high)  # its provisioning step holds it now
    admission.admit_fleet(fleet.pk)
    assert sent["provision"] == [high], f"low ({low}) is not woken for the hosts high is taking"
    assert token
    claims.forget_all()


def test_idle_hosts_that_do_not_fit_a_run_s_resources_do_not_wake_it(sent):
    fleet = local_project_fleet(size=2)
    gpu = _waiting(fleet, "gpu", 90, extra="resources: {gpu: 8}\n")
    cpu = _waiting(fleet, "cpu", 10)
    sent["provision"].clear()
    _idle(fleet, 1)
    admission.admit_fleet(fleet.pk)
    assert sent["provision"] == [cpu], f"the GPU run ({gpu}) is not woken for a host without GPUs"


def test_a_look_that_woke_runs_looks_again_once_its_promise_is_over_even_after_a_release(sent, monkeypatch):
    fleet = local_project_fleet(size=2)
    _waiting(fleet, "first", 50)
    sent["provision"].clear()
    _idle(fleet, 1)
    original = admission._admit

    def look_with_a_release_meanwhile(held):
        looked = original(held)
        admission.released([fleet.pk])
        return looked

    monkeypatch.setattr(admission, "_admit", look_with_a_release_meanwhile)
    admission.admit_fleet(fleet.pk)
    assert sorted(sent["admit"]) == [(fleet.pk, 0), (fleet.pk, admission.PROMISE_SECONDS)], sent["admit"]
