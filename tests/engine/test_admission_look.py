"""The fleet's admission look (engine/admission.py) on rows set up as the engine leaves them: which
waiting jobs the idle hosts go to (a task is placed by the look itself: its job is on a host when
the look returns; a service replica is woken to its own step), that a burst's second look does not
offer the same hosts twice, and that a release while a look holds the fleet's row is looked at
afterwards. The look's messages are caught as they are sent (no worker): what is under test is the
choice, the placements and the row's counters."""

from __future__ import annotations

import time

import pytest

from engine import admission, claims, messages
from engine.submitted import waiting
from instances.fleet_queue import want
from instances.models import FleetQueue, Instance
from muster.claimable import released
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


def _placed(*pks: int) -> list[int]:
    """Those of `pks` on a host now, in the order given."""
    on = set(Job.objects.filter(pk__in=pks, instance__isnull=False, status="provisioning").values_list("pk", flat=True))
    return [pk for pk in pks if pk in on]


def _idle(fleet, count: int) -> None:
    hosts = list(fleet.instances.order_by("index").values_list("pk", flat=True))
    Instance.objects.filter(pk__in=hosts).update(status="busy")
    Instance.objects.filter(pk__in=hosts[:count]).update(status="idle")


@pytest.mark.step_case("admit_fleet", "success")
def test_idle_hosts_go_to_the_waiting_runs_in_queue_order_placed_by_the_look(sent):
    fleet = local_project_fleet(size=4)
    low, high, mid = _waiting(fleet, "low", 10), _waiting(fleet, "high", 90), _waiting(fleet, "mid", 50)
    big = _waiting(fleet, "big", 70, nodes=3)
    sent["provision"].clear()  # the submissions' own messages
    _idle(fleet, 2)
    admission.admit_fleet(fleet.pk)
    assert _placed(low, high, mid, big) == [high, mid], "the highest priorities that fit; big (3 hosts) is passed over"
    assert sent["provision"] == [], "placed by the look: no message per run"
    assert sent["admit"] == [], "all it chose were placed: no look again"
    admission.admit_fleet(fleet.pk)  # at once, as a burst's next release: no host is idle
    assert _placed(low, high, mid, big) == [high, mid]
    Job.objects.filter(pk__in=[high, mid]).update(status="done", instance=None)  # they ended
    _idle(fleet, 3)
    admission.admit_fleet(fleet.pk)
    assert _placed(low, big) == [big], "three idle hosts hold big now, before low"
    assert Job.objects.filter(run=Job.objects.get(pk=big).run, instance__isnull=False).count() == 3, "its whole gang"
    assert FleetQueue.objects.get(pk=fleet.pk).promised == {}, "nothing is promised to a job placed"


def test_a_service_replica_is_woken_and_promised_not_placed_by_the_look(sent):
    fleet = local_project_fleet(size=2)
    run = submit_run(fleet.project, None, {"configuration": "type: service\nname: svc\ncommands: [sleep 1]\n"
                                           "port: 8000\nretry: {on_events: [no-capacity], duration: 1h}\n"})
    replica = run.current_jobs().get(job_num=0).pk
    Job.objects.filter(pk=replica).update(waiting_for=f"a free host: fleet {fleet.name} is full")
    sent["provision"].clear()
    _idle(fleet, 1)
    admission.admit_fleet(fleet.pk)
    assert sent["provision"] == [replica] and _placed(replica) == []
    admission.admit_fleet(fleet.pk)
    assert sent["provision"] == [replica], "the promised replica is not woken again, nor its host offered"
    assert set(map(int, FleetQueue.objects.get(pk=fleet.pk).promised)) == {replica}
    assert (fleet.pk, admission.PROMISE_SECONDS) in sent["admit"], "it looks again once the promise is over"


def test_a_job_the_look_could_not_place_is_passed_over_until_its_recheck(sent):
    fleet = local_project_fleet(size=2)
    first, second = _waiting(fleet, "first", 50), _waiting(fleet, "second", 10)
    sent["provision"].clear()
    _idle(fleet, 1)
    FleetQueue.objects.get_or_create(fleet=fleet)
    FleetQueue.objects.filter(pk=fleet.pk).update(promised={str(first): [time.time() - 30, 1]})  # tried, not placed
    admission.admit_fleet(fleet.pk)
    assert _placed(first, second) == [second], "the host goes to the next run, not to the one it did not fit"


def test_a_release_while_a_look_holds_the_row_is_looked_at_afterwards(sent, monkeypatch):
    fleet = local_project_fleet(size=2)
    _idle(fleet, 0)
    admission.admit_fleet(fleet.pk)  # the row is made; nothing to do
    sent["admit"].clear()
    original = admission._admit

    def look_with_a_release_meanwhile(held):
        looked = original(held)
        waiting.released([fleet.pk])  # after the look read the row, before it is given back
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
def test_a_look_whose_lease_was_lost_writes_nothing_to_the_row_and_sends_nothing(sent, monkeypatch):
    """The placements it made are the jobs' own claimed steps (each guarded by its job's lease and
    the fleet's lock): they stand; what the look would have written of the row and sent is dropped."""
    fleet = local_project_fleet(size=2)
    _waiting(fleet, "waiter", 50)
    waiter = _waiting(fleet, "waiter-svc", 90, extra="resources: {gpu: 8}\n")  # no host fits: not chosen
    sent["provision"].clear()
    _idle(fleet, 1)
    want([fleet.pk])
    around_body(monkeypatch, admission, "_admit", steal(FleetQueue))
    admission.admit_fleet(fleet.pk)
    row = FleetQueue.objects.get(pk=fleet.pk)
    assert sent["provision"] == [] and sent["admit"] == [], "its messages go with its outcome, dropped with it"
    assert (row.lease_token, row.admitted, row.promised) == ("someone-else", 0, {})
    assert _placed(waiter) == []


@pytest.mark.step_case("admit_fleet", "contention")
def test_a_look_does_nothing_while_another_worker_holds_the_fleet_s_row(sent):
    fleet = local_project_fleet(size=2)
    waiter = _waiting(fleet, "waiter", 50)
    sent["provision"].clear()
    _idle(fleet, 1)
    want([fleet.pk])
    token = claims.claim(FleetQueue, fleet.pk)
    admission.admit_fleet(fleet.pk)
    assert sent["provision"] == [] and FleetQueue.objects.get(pk=fleet.pk).lease_token == token
    assert _placed(waiter) == []
    claims.forget_all()


def test_a_run_that_may_use_several_fleets_is_placed_by_any_of_them(sent):
    a = local_project_fleet(size=1, name="a")
    b = local_project_fleet(size=1, name="b")
    anywhere = _waiting(a, "anywhere", 10, says="a")  # no `fleets:`: its wait names the first that would hold it
    only_a = [_waiting(a, f"only-a-{i}", 90, extra="fleets: [a]\n") for i in range(3)]
    sent["provision"].clear()
    _idle(a, 0)
    _idle(b, 1)
    admission.admit_fleet(b.pk)
    assert _placed(anywhere, *only_a) == [anywhere], f"b's host goes to the run that may use b, past {only_a} (only a)"
    assert Job.objects.get(pk=anywhere).instance.fleet_id == b.pk


def test_a_job_its_own_step_holds_keeps_the_hosts_a_moment_then_the_look_places_it(sent):
    fleet = local_project_fleet(size=2)
    high = _waiting(fleet, "high", 90, nodes=2)
    low = _waiting(fleet, "low", 10, nodes=2)
    sent["provision"].clear()
    _idle(fleet, 2)
    token = claims.claim(Job, high)  # its provisioning step (a recheck) holds it now
    admission.admit_fleet(fleet.pk)
    assert _placed(high, low) == [], f"low ({low}) is not placed on the hosts high's own step may be taking"
    assert set(map(int, FleetQueue.objects.get(pk=fleet.pk).promised)) == {high}
    assert sent["admit"] == [(fleet.pk, admission.HELD_SECONDS)], "looked at again in a moment, not a whole promise"
    Job.objects.filter(pk=high).update(**released())  # its step gave it back, still waiting
    claims.forget_all()
    admission.admit_fleet(fleet.pk)
    assert _placed(high, low) == [], "within that moment the hosts are high's: nobody is placed"
    time.sleep(admission.HELD_SECONDS + 0.1)
    admission.admit_fleet(fleet.pk)
    assert _placed(high, low) == [high], "once the moment is over the look places it"
    assert token


def test_idle_hosts_that_do_not_fit_a_run_s_resources_do_not_go_to_it(sent):
    fleet = local_project_fleet(size=2)
    gpu = _waiting(fleet, "gpu", 90, extra="resources: {gpu: 8}\n")
    cpu = _waiting(fleet, "cpu", 10)
    sent["provision"].clear()
    _idle(fleet, 1)
    admission.admit_fleet(fleet.pk)
    assert _placed(gpu, cpu) == [cpu], f"the GPU run ({gpu}) is not chosen for a host without GPUs"


def test_a_look_that_could_not_place_looks_again_in_a_moment_even_after_a_release(sent, monkeypatch):
    fleet = local_project_fleet(size=2)
    first = _waiting(fleet, "first", 50)
    sent["provision"].clear()
    _idle(fleet, 1)
    token = claims.claim(Job, first)  # held by its own step: the look cannot place it now
    original = admission._admit

    def look_with_a_release_meanwhile(held):
        looked = original(held)
        waiting.released([fleet.pk])
        return looked

    monkeypatch.setattr(admission, "_admit", look_with_a_release_meanwhile)
    admission.admit_fleet(fleet.pk)
    assert sorted(sent["admit"]) == [(fleet.pk, 0), (fleet.pk, admission.HELD_SECONDS)], sent["admit"]
    assert token
    claims.forget_all()


def test_a_burst_of_releases_sends_one_look_and_the_look_after_it_places_them_all(sent):
    fleet = local_project_fleet(size=3)
    waiters = [_waiting(fleet, f"w{i}", 50) for i in range(3)]
    sent["provision"].clear()
    _idle(fleet, 0)
    admission.admit_fleet(fleet.pk)  # the row is made; nothing idle
    sent["admit"].clear()
    for count in (1, 2, 3):
        _idle(fleet, count)
        waiting.released([fleet.pk])
    gather = waiting.GATHER_SECONDS
    assert gather > 0
    assert sent["admit"] == [(fleet.pk, gather)], "only the first release since the last look sends one, " \
        "a moment later so that those close behind it are its too"
    admission.admit_fleet(fleet.pk)
    assert _placed(*waiters) == waiters, "the look placed the three hosts' runs"
    row = FleetQueue.objects.get(pk=fleet.pk)
    assert (row.wanted, row.admitted) == (3, 3)
    _idle(fleet, 0)
    waiting.released([fleet.pk])
    assert sent["admit"] == [(fleet.pk, gather)] * 2, "the next release after that look sends the next"


def test_a_recheck_that_finds_room_asks_the_look_which_places_the_queue_s_head(sent):
    from engine.submitted.provision import provision_job

    fleet = local_project_fleet(size=2)
    low = _waiting(fleet, "low", 10)
    high = _waiting(fleet, "high", 90)
    sent["provision"].clear()
    _idle(fleet, 0)
    admission.admit_fleet(fleet.pk)  # the row is made; nothing idle
    sent["admit"].clear()
    _idle(fleet, 1)
    assert provision_job(low), "low's own recheck ran"
    assert _placed(low, high) == [], "it did not take the host past high"
    assert Job.objects.get(pk=low).waiting_for.startswith("a free host"), "low still waits"
    assert sent["admit"] == [(fleet.pk, waiting.GATHER_SECONDS)], "it asked the fleet's look"
    admission.admit_fleet(fleet.pk)
    assert _placed(low, high) == [high]


def test_a_look_whose_claim_skipped_the_row_while_a_release_counted_is_sent_again(sent, monkeypatch):
    """The claim skips a row another transaction has locked (SKIP LOCKED): a release counting on the
    row at that moment sent no look (this one was out), so the look sends itself again."""
    fleet = local_project_fleet(size=1)
    _waiting(fleet, "waiter", 50)
    _idle(fleet, 0)
    admission.admit_fleet(fleet.pk)  # the row is made
    sent["admit"].clear()
    want([fleet.pk])  # a release counted: its look is out
    monkeypatch.setattr(claims, "claimed", lambda *args, **kwargs: None)  # as if the row was locked
    admission.admit_fleet(fleet.pk)
    assert sent["admit"] == [(fleet.pk, admission.RETRY_SECONDS)]
    FleetQueue.objects.filter(pk=fleet.pk).update(admitted=1)  # a look looked meanwhile
    admission.admit_fleet(fleet.pk)
    assert sent["admit"] == [(fleet.pk, admission.RETRY_SECONDS)], "nothing left to look at: not sent again"


def test_a_deep_small_run_behind_big_ones_is_placed_by_its_own_recheck(sent, monkeypatch):
    """Beyond the look's read (the first READ_MARGIN of the queue), behind runs the idle hosts do not
    fit, a waiting run's recheck places it itself: no look would reach it."""
    from engine.submitted.provision import provision_job

    monkeypatch.setattr(waiting, "READ_MARGIN", 2)
    fleet = local_project_fleet(size=2)
    big = [_waiting(fleet, f"big-{i}", 90, nodes=2) for i in range(2)]
    small = _waiting(fleet, "small", 10)
    sent["provision"].clear()
    _idle(fleet, 1)
    assert provision_job(small)
    assert _placed(small, *big) == [small]


def test_a_deep_run_s_recheck_asks_the_look_when_runs_before_it_fit(sent, monkeypatch):
    from engine.submitted.provision import provision_job

    monkeypatch.setattr(waiting, "READ_MARGIN", 1)
    fleet = local_project_fleet(size=2)
    high = _waiting(fleet, "high", 90)
    deep = _waiting(fleet, "deep", 10)
    sent["provision"].clear()
    _idle(fleet, 1)
    assert provision_job(deep)
    assert _placed(high, deep) == [], "high, before it, fits the idle host: the look's to place"
    assert [pk for pk, _ in sent["admit"]] == [fleet.pk]



def test_a_batch_of_rechecks_reads_the_look_s_queue_once_and_each_asks_the_look(sent, monkeypatch):
    """The sweep's rechecks go as one step (provision.recheck_jobs): the fleet's look's heads, which
    each recheck that finds room reads to know whether the look places it, are read once for them all."""
    from engine.submitted import provision
    from runs import admission_order

    monkeypatch.setattr(waiting, "READ_MARGIN", 1)
    fleet = local_project_fleet(size=3)
    high = _waiting(fleet, "high", 90)
    deep = [_waiting(fleet, f"deep-{i}", 10) for i in range(2)]
    _idle(fleet, 1)
    sent["admit"].clear()
    reads = []
    original = admission_order.heads_for
    monkeypatch.setattr(admission_order, "heads_for", lambda *a: reads.append(a) or original(*a))
    assert provision.recheck_jobs(deep) == set(deep)
    assert len(reads) == 1, reads
    assert _placed(high, *deep) == [], "high, before them, fits the idle host: the look's to place"
    assert [pk for pk, _ in sent["admit"]] == [fleet.pk], "the look asked (the second ask counted on its row)"
    assert FleetQueue.objects.get(pk=fleet.pk).wanted == 2


def test_a_look_counts_its_own_placements_against_a_project_s_quota_so_the_run_past_it_goes_elsewhere(sent):
    """The look chooses by the queue, not the quota; the runs it places choose their fleet with what
    the step read of the shared fleet's usage, counted up by each run it placed there (instances/
    shares.py `took`): the run past the project's quota goes to the project's other fleet, not onto
    the shared one to be refused there (and left on it)."""
    from instances.models import FleetShare
    from projects.models import Project

    pool = local_project_fleet(size=3, name="pool")
    spare = local_project_fleet(size=1, name="spare")
    FleetShare.objects.create(fleet=pool, project=pool.project, hosts=2)
    FleetShare.objects.create(fleet=pool, project=Project.objects.create(name="research"), hosts=1)
    runs = [_waiting(pool, f"r{i}", 50) for i in range(3)]
    _idle(pool, 3)
    admission.admit_fleet(pool.pk)
    assert _placed(*runs) == runs
    fleets = [Job.objects.get(pk=pk).instance.fleet_id for pk in runs]
    assert fleets == [pool.pk, pool.pk, spare.pk], "two on the shared fleet (its quota), the third on its own"
