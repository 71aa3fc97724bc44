"""The runs a look places together (engine/submitted/together.py): one transaction for the runs
alike (one group, one fleet they may use), each written as its own attempt writes it; quotas asked in
the look's order with the ones before counted; a run stopped meanwhile leaves nothing half-placed;
the runs not alike placed by their own attempts in the same step. Driven through the look
(engine/admission.py) on rows set up as the engine leaves them; the look's messages are caught."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext

from engine import admission, messages
from engine.submitted import together
from events.models import Event
from instances.models import FleetShare, Instance
from projects.models import Project
from runs.models import Job, Run
from runs.services.submission import submit_run
from tests.engine.helpers import local_project_fleet
from tests.engine.test_admission_look import WAITER, _idle, _placed, _waiting

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def sent(monkeypatch):
    got = {"provision": [], "admit": [], "advance": []}
    monkeypatch.setattr(messages, "provision_job", lambda pk: got["provision"].append(pk))
    monkeypatch.setattr(messages, "admit_fleet", lambda pk, countdown=0: got["admit"].append((pk, countdown)))
    monkeypatch.setattr(messages, "advance_job", lambda pk, countdown=0: got["advance"].append(pk))
    return got


@pytest.fixture
def together_placed(monkeypatch):
    """The job ids each place_together call placed, in order."""
    got: list[list[int]] = []
    real = together.place_together

    def spy(*args):
        placed = real(*args)
        got.append([job.pk for job, _, _ in placed[0]] if placed else [])
        return placed

    monkeypatch.setattr(together, "place_together", spy)
    return got


def _gang(fleet, name: str, priority: int, nodes: int) -> int:
    """A waiting run of one group of `nodes`, as the engine leaves it: job 0 waits, the rest wait for it."""
    conf = WAITER.format(name=name, nodes=nodes, priority=priority, extra="")
    run = submit_run(fleet.project, None, {"configuration": conf})
    Job.objects.filter(run=run, job_num=0).update(waiting_for=f"a free host: fleet {fleet.name} is full")
    return run.current_jobs().get(job_num=0).pk


def _two_groups(fleet, name: str, priority: int) -> int:
    """A waiting run of two groups of one node each: not alike (its groups may go to different fleets)."""
    conf = (f"type: task\nname: {name}\npriority: {priority}\nretry: {{on_events: [no-capacity], duration: 1h}}\n"
            "groups:\n- {name: x, nodes: 1, commands: [echo]}\n- {name: y, nodes: 1, commands: [echo]}\n")
    run = submit_run(fleet.project, None, {"configuration": conf})
    Job.objects.filter(run=run).update(waiting_for=f"a free host: fleet {fleet.name} is full")
    return run.current_jobs().get(job_num=0).pk


def _meanwhile(monkeypatch, write) -> list:
    """`write` made by another worker (a thread with its own connection) once the batch chose its
    hosts, before it moves the rows; returns what each place_runs call gave (None: rolled back)."""
    picks, real, said = together._picks, together.place_runs, []

    def chosen(*args):
        got = picks(*args)

        def other():
            write()
            connections.close_all()
        worker = threading.Thread(target=other)
        worker.start()
        worker.join()
        return got

    monkeypatch.setattr(together, "_picks", chosen)
    monkeypatch.setattr(together, "place_runs", lambda *a: said.append(real(*a)) or said[-1])
    return said


POSTGRES = pytest.mark.skipif(connection.vendor != "postgresql",
                              reason="another connection's write mid-step, and the one-statement moves, are PostgreSQL's")


def _of(project, fleet, name: str, priority: int = 50) -> int:
    """A waiting run of `project` (another one than the fleet's owner) naming the shared fleet."""
    conf = WAITER.format(name=name, nodes=1, priority=priority, extra=f"fleets: [{fleet.project.name}/{fleet.name}]\n")
    run = submit_run(project, None, {"configuration": conf})
    Job.objects.filter(run=run).update(waiting_for=f"a free host: fleet {fleet.name} is full")
    return run.current_jobs().get(job_num=0).pk


def test_runs_alike_are_placed_together_in_a_handful_of_statements_each_written_as_its_own_attempt(sent):
    """One-job runs; a gang's rows: the next test."""
    fleet = local_project_fleet(size=12, name="pool")
    jobs = [_waiting(fleet, f"r{i}", 50) for i in range(12)]
    _idle(fleet, 12)
    with CaptureQueriesContext(connection) as q:
        admission.admit_fleet(fleet.pk)
    assert _placed(*jobs) == jobs
    # one at a time each run cost about twenty statements (its choice, its run, the take, its job)
    assert len(q) < 40, [s["sql"][:120] for s in q]
    assert sorted(sent["advance"]) == sorted(jobs), "each placed job's start is sent, after the give-back"
    hosts = set()
    for pk in jobs:
        job = Job.objects.select_related("run", "instance").get(pk=pk)
        run, inst = job.run, job.instance
        hosts.add(inst.pk)
        assert (run.status, run.fleet_id, job.fleet_id) == ("provisioning", fleet.pk, fleet.pk)
        assert (job.waiting_for, job.next_check_at, job.waiting_fleet_id, job.lease_token) == ("", None, None, "")
        assert job.host_wait is not None and job.host_wait.total_seconds() >= 0
        assert (inst.status, inst.holder_id) == ("busy", run.project_id)
        said = set(Event.objects.filter(run=run).values_list("subject", "status", "message", "job_id", "instance_id"))
        assert said >= {
            (f"run {run.name}", "provisioning", "placed on fleet pool", None, None),
            (f"job {run.name}/0", "provisioning", f"provisioning on {inst.name} ({inst.internal_ip})", pk, inst.pk),
            (f"instance {inst.name}", "busy", f"taken by job {run.name}/0 for its group default", pk, inst.pk)}
    assert len(hosts) == 12, "each host given once"


def test_a_shared_fleet_s_quota_is_asked_in_the_look_s_order_with_the_runs_before_counted(sent, together_placed):
    fleet = local_project_fleet(size=4, name="pool")
    research = Project.objects.create(name="research")
    FleetShare.objects.create(fleet=fleet, project=fleet.project, hosts=2)
    FleetShare.objects.create(fleet=fleet, project=research, hosts=2)
    # the same names in both projects
    mine = [_waiting(fleet, f"r{i}", 50) for i in range(3)]
    theirs = [_of(research, fleet, "r0")]
    _idle(fleet, 4)
    admission.admit_fleet(fleet.pk)  # the look chooses by the queue: all four runs, for four hosts
    placed = _placed(*mine, *theirs)
    assert placed == [*mine[:2], *theirs], "the third of main would pass its quota of 2"
    assert sorted(together_placed[0]) == sorted(placed), "placed together; the third refused there, then alone"
    assert Instance.objects.filter(fleet=fleet, status="idle").count() == 1
    third = Job.objects.get(pk=mine[2])
    assert third.waiting_for.startswith("a free host: quota: project main holds 2 of its 2 hosts"), third.waiting_for
    assert set(Instance.objects.filter(fleet=fleet, status="busy").values_list("holder_id", flat=True)) == {
        fleet.project_id, research.pk}
    for pk in placed:  # each run's events are its own project's, whatever the names
        job = Job.objects.select_related("run").get(pk=pk)
        assert set(Event.objects.filter(job_id=pk).values_list("project_id", flat=True)) == {job.run.project_id}


@POSTGRES
def test_a_run_stopped_while_the_look_places_leaves_nothing_half_placed(sent, monkeypatch):
    fleet = local_project_fleet(size=3, name="pool")
    jobs = [_waiting(fleet, f"r{i}", 50) for i in range(3)]
    _idle(fleet, 3)
    stopped = Job.objects.get(pk=jobs[1]).run_id
    # a user's stop, as process_run ends a run that never started
    said = _meanwhile(monkeypatch, lambda: Run.objects.filter(pk=stopped).update(
        status="terminated", stop_requested="stop"))
    admission.admit_fleet(fleet.pk)
    assert said == [None], "the batch saw the stop and was rolled back"
    assert Run.objects.get(pk=stopped).status == "terminated", "the batch's write did not pass over the stop"
    # rolled back whole, then each attempted alone (one whose step read it before the stop is placed
    # as its own attempt always placed it, and its teardown gives the host back)
    assert {jobs[0], jobs[2]} <= set(_placed(*jobs))
    busy = Instance.objects.filter(fleet=fleet, status="busy")
    holders = list(Job.objects.filter(pk__in=jobs, instance__isnull=False).values_list("instance_id", flat=True))
    assert sorted(busy.values_list("pk", flat=True)) == sorted(holders), "no host held by nobody, none by two"
    assert not Event.objects.filter(run_id=stopped, message__startswith="placed on").exists(), \
        "the batch's run move is rolled back, and the run's own attempt finds it stopped"


@POSTGRES
def test_runs_not_alike_are_placed_by_their_own_attempts_in_the_same_look(sent):
    fleet = local_project_fleet(size=5, name="pool")
    spare = local_project_fleet(size=1, name="spare")
    Instance.objects.filter(fleet=spare).update(status="busy")
    gang = _two_groups(fleet, "gang", 90)
    anywhere = _waiting(fleet, "anywhere", 70, extra="fleets: [spare, pool]\n")
    alone = [_waiting(fleet, f"r{i}", 50, extra="fleets: [pool]\n") for i in range(2)]
    _idle(fleet, 5)
    with CaptureQueriesContext(connection) as q:
        admission.admit_fleet(fleet.pk)
    assert _placed(gang, anywhere, *alone) == [gang, anywhere, *alone]
    assert Job.objects.filter(run=Job.objects.get(pk=gang).run, instance__isnull=False).count() == 2, "both groups"
    assert len({Job.objects.get(pk=pk).instance_id for pk in [gang, anywhere, *alone]}) == 4
    moves = [s["sql"] for s in q if s["sql"].startswith('UPDATE "runs_run"')]
    assert len(moves) == 1, "the two alike in one UPDATE; the others each by its attempt's own move (WITH ... INSERT)"


def test_a_run_not_alike_before_the_runs_alike_gets_the_last_hosts_first(sent, monkeypatch, together_placed):
    """The look chose by the idle hosts it counted; one is taken by another step before it places.
    The gang (priority 90) comes first in the look's order and gets its two hosts; the run alike
    behind it (50) is the one left waiting, as when every run was attempted alone."""
    from engine.submitted import provision

    fleet = local_project_fleet(size=3, name="pool")
    gang = _two_groups(fleet, "gang", 90)
    alike = _waiting(fleet, "alike", 50)
    _idle(fleet, 3)
    real = provision.provision_jobs

    def one_taken(job_ids, look_fleet=None):
        Instance.objects.filter(pk=fleet.instances.order_by("index").last().pk).update(status="busy")
        return real(job_ids, look_fleet)

    monkeypatch.setattr(provision, "provision_jobs", one_taken)
    admission.admit_fleet(fleet.pk)
    assert _placed(gang, alike) == [gang]
    assert Job.objects.filter(run=Job.objects.get(pk=gang).run, instance__isnull=False).count() == 2
    assert together_placed == [[]], "the run alike was tried after the gang, and found no host"


def test_an_error_placing_together_leaves_each_run_to_its_own_attempt(sent, monkeypatch, caplog):
    fleet = local_project_fleet(size=2, name="pool")
    jobs = [_waiting(fleet, f"r{i}", 50) for i in range(2)]
    _idle(fleet, 2)

    def broken(*args):
        raise RuntimeError("a statement timed out")

    monkeypatch.setattr(together, "_picks", broken)
    admission.admit_fleet(fleet.pk)
    assert _placed(*jobs) == jobs, "each placed by its own attempt"
    assert set(Job.objects.filter(pk__in=jobs).values_list("lease_token", flat=True)) == {""}, "none backed off"
    assert "placing runs together failed" in caplog.text


def test_a_run_whose_group_names_another_fleet_is_not_placed_together(sent, together_placed):
    """A run's group may narrow its fleets (`groups[0].fleets`); with that fleet gone, the run may
    not go to the look's fleet, as its own attempt says."""
    from instances.models import Fleet

    fleet = local_project_fleet(size=1, name="pool")
    other = local_project_fleet(size=1, name="other")
    conf = ("type: task\nname: narrow\nfleets: [pool, other]\nretry: {on_events: [no-capacity], duration: 1h}\n"
            "groups:\n- {name: x, nodes: 1, fleets: [other], commands: [echo]}\n")
    run = submit_run(fleet.project, None, {"configuration": conf})
    Job.objects.filter(run=run).update(waiting_for="a free host: fleet pool is full")
    job = run.current_jobs().get(job_num=0).pk
    Fleet.objects.filter(pk=other.pk).update(status="terminating")
    _idle(fleet, 1)
    admission.admit_fleet(fleet.pk)
    assert _placed(job) == []
    assert together_placed == [], "not alike: only its own attempt was made"
    assert Instance.objects.get(fleet=fleet).status == "idle"


def test_a_gang_of_one_group_is_placed_together_each_member_on_its_host_as_its_master_places_it(
        sent, together_placed):
    fleet = local_project_fleet(size=7, name="pool")
    gangs = [_gang(fleet, f"g{i}", 50, nodes=3) for i in range(2)]
    single = _waiting(fleet, "single", 50)
    sent["provision"].clear()  # the submissions' own messages
    _idle(fleet, 7)
    admission.admit_fleet(fleet.pk)
    assert sent["provision"] == [], "no member is released to a step of its own: each is on its host"
    assert _placed(*gangs, single) == [*gangs, single]
    assert together_placed == [[*gangs, single]], "the gangs and the one-job run in one batch"
    hosts = set()
    for pk in gangs:
        master = Job.objects.select_related("run").get(pk=pk)
        run = master.run
        jobs = list(run.current_jobs().select_related("instance").order_by("job_num"))
        assert [(j.status, j.fleet_id, j.waiting_master_job) for j in jobs] == [("provisioning", fleet.pk, False)] * 3
        hosts |= {j.instance_id for j in jobs}
        assert master.host_wait is not None and [j.host_wait for j in jobs[1:]] == [None, None]
        assert [j.instance_id for j in jobs] == sorted(j.instance_id for j in jobs), "job 0 on the first host"
        moves = list(Event.objects.filter(run=run, status__in=["provisioning", "busy"]).values_list(
            "subject", "message", "job_id", "instance_id"))
        assert len(moves) == 7, moves  # the run's move, three jobs', three hosts'
        said = set(moves)
        for j in jobs[1:]:
            inst = j.instance
            assert (f"job {run.name}/{j.job_num}", f"provisioning on {inst.name} ({inst.internal_ip}), placed by job 0 "
                    "with its group", j.pk, inst.pk) in said
        for j in jobs:
            assert (f"instance {j.instance.name}", f"taken by job {run.name}/0 for its group default", master.pk,
                    j.instance_id) in said
        assert set(sent["advance"]) >= {j.pk for j in jobs}, "each job's start is sent: the members' with the master's"
    assert len(hosts) == 6 and Instance.objects.filter(fleet=fleet, status="busy").count() == 7


def test_a_gang_on_a_fleet_whose_hosts_may_not_reach_each_other_is_not_placed_together(sent, together_placed):
    from instances.services.fleets import create_local_fleet
    from projects.models import Project

    fleet = create_local_fleet(Project.objects.get_or_create(name="main")[0], "loose", 2, placement="any")
    gang = _waiting(fleet, "gang", 50, nodes=2)
    _idle(fleet, 2)
    admission.admit_fleet(fleet.pk)
    assert together_placed == [], "its own attempt decides (it may not go there: placement any)"
    assert _placed(gang) == []


@POSTGRES
def test_a_member_stopped_while_the_look_places_its_gang_leaves_nothing_half_placed(sent, monkeypatch):
    fleet = local_project_fleet(size=3, name="pool")
    gang = _gang(fleet, "gang", 50, nodes=3)
    run = Job.objects.get(pk=gang).run
    member = Job.objects.get(run=run, job_num=2).pk
    _idle(fleet, 3)
    said = _meanwhile(monkeypatch, lambda: Job.objects.filter(pk=member).update(status="terminated"))
    admission.admit_fleet(fleet.pk)
    assert said == [None], "the batch saw the member's end and was rolled back"
    assert Job.objects.get(pk=member).instance_id is None and Job.objects.get(pk=member).status == "terminated"
    busy = sorted(Instance.objects.filter(fleet=fleet, status="busy").values_list("pk", flat=True))
    holders = sorted(Job.objects.filter(run=run, instance__isnull=False).values_list("instance_id", flat=True))
    assert busy == holders, "no host held by nobody, none by two"


def test_a_gang_past_its_project_s_quota_is_refused_with_the_gangs_before_it_counted(sent, together_placed):
    fleet = local_project_fleet(size=6, name="pool")
    research = Project.objects.create(name="research")
    FleetShare.objects.create(fleet=fleet, project=fleet.project, hosts=4)
    FleetShare.objects.create(fleet=fleet, project=research, hosts=2)
    first, second = _gang(fleet, "first", 50, nodes=3), _gang(fleet, "second", 50, nodes=3)
    _idle(fleet, 6)
    admission.admit_fleet(fleet.pk)  # the look chooses by the queue: both, for six hosts
    assert _placed(first, second) == [first]
    assert together_placed == [[first]], "three hosts held, three more would pass main's quota of 4"
    assert Job.objects.get(pk=second).waiting_for.startswith(
        "a free host: quota: project main holds 3 of its 4 hosts of fleet pool (borrowing: none) and needs 3")
    assert Instance.objects.filter(fleet=fleet, status="busy").count() == 3


def test_hosts_that_another_shape_took_are_read_past_so_a_gang_is_placed_with_the_rest(sent, together_placed):
    """Each shape of resources reads its idle hosts a page at a time; a gang whose first page the
    runs before it took (another shape, the same hosts) reads on, as its own attempt would."""
    fleet = local_project_fleet(size=14, name="pool")
    small = [_waiting(fleet, f"s{i}", 60, extra="resources: {memory: 0.5GB..}\n") for i in range(10)]
    gang = _gang(fleet, "gang", 50, nodes=3)
    _idle(fleet, 14)
    admission.admit_fleet(fleet.pk)
    assert _placed(*small, gang) == [*small, gang]
    assert together_placed == [[*small, gang]], "one batch, the gang in it"
