"""The runs a look places together (engine/submitted/together.py): one transaction for the runs
alike (one job, one fleet they may use), each written as its own attempt writes it; quotas asked in
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


def _of(project, fleet, name: str, priority: int = 50) -> int:
    """A waiting run of `project` (another one than the fleet's owner) naming the shared fleet."""
    conf = WAITER.format(name=name, nodes=1, priority=priority, extra=f"fleets: [{fleet.project.name}/{fleet.name}]\n")
    run = submit_run(project, None, {"configuration": conf})
    Job.objects.filter(run=run).update(waiting_for=f"a free host: fleet {fleet.name} is full")
    return run.current_jobs().get(job_num=0).pk


def test_runs_alike_are_placed_together_in_a_handful_of_statements_each_written_as_its_own_attempt(sent):
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


def test_a_shared_fleet_s_quota_is_asked_in_the_look_s_order_with_the_runs_before_counted(sent):
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
    assert Instance.objects.filter(fleet=fleet, status="idle").count() == 1
    third = Job.objects.get(pk=mine[2])
    assert third.waiting_for.startswith("a free host: quota: project main holds 2 of its 2 hosts"), third.waiting_for
    assert set(Instance.objects.filter(fleet=fleet, status="busy").values_list("holder_id", flat=True)) == {
        fleet.project_id, research.pk}
    for pk in placed:  # each run's events are its own project's, whatever the names
        job = Job.objects.select_related("run").get(pk=pk)
        assert set(Event.objects.filter(job_id=pk).values_list("project_id", flat=True)) == {job.run.project_id}


def test_a_run_stopped_while_the_look_places_leaves_nothing_half_placed(sent, monkeypatch):
    fleet = local_project_fleet(size=3, name="pool")
    jobs = [_waiting(fleet, f"r{i}", 50) for i in range(3)]
    _idle(fleet, 3)
    stopped = Job.objects.get(pk=jobs[1]).run_id
    picks = together._picks

    def stop_first(*args):
        got = picks(*args)
        # a user's stop, as process_run ends a run that never started: another worker's write
        def stop():
            Run.objects.filter(pk=stopped).update(status="terminated", stop_requested="stop")
            connections.close_all()
        worker = threading.Thread(target=stop)
        worker.start()
        worker.join()
        return got

    monkeypatch.setattr(together, "_picks", stop_first)
    admission.admit_fleet(fleet.pk)
    assert Run.objects.get(pk=stopped).status == "terminated", "the batch's write did not pass over the stop"
    # rolled back whole, then each attempted alone (one whose step read it before the stop is placed
    # as its own attempt always placed it, and its teardown gives the host back)
    assert {jobs[0], jobs[2]} <= set(_placed(*jobs))
    busy = Instance.objects.filter(fleet=fleet, status="busy")
    holders = list(Job.objects.filter(pk__in=jobs, instance__isnull=False).values_list("instance_id", flat=True))
    assert sorted(busy.values_list("pk", flat=True)) == sorted(holders), "no host held by nobody, none by two"
    assert Event.objects.filter(run_id=stopped, message__startswith="placed on").count() <= 1


def test_runs_not_alike_are_placed_by_their_own_attempts_in_the_same_look(sent):
    fleet = local_project_fleet(size=5, name="pool")
    spare = local_project_fleet(size=1, name="spare")
    Instance.objects.filter(fleet=spare).update(status="busy")
    gang = _waiting(fleet, "gang", 90, nodes=2)
    anywhere = _waiting(fleet, "anywhere", 70, extra="fleets: [spare, pool]\n")
    alone = [_waiting(fleet, f"r{i}", 50, extra="fleets: [pool]\n") for i in range(2)]
    _idle(fleet, 5)
    with CaptureQueriesContext(connection) as q:
        admission.admit_fleet(fleet.pk)
    assert _placed(gang, anywhere, *alone) == [gang, anywhere, *alone]
    assert Job.objects.filter(run=Job.objects.get(pk=gang).run, instance__isnull=False).count() == 2
    assert len({Job.objects.get(pk=pk).instance_id for pk in [gang, anywhere, *alone]}) == 4
    moves = [s["sql"] for s in q if s["sql"].startswith('UPDATE "runs_run"')]
    assert len(moves) == 1, "the two alike in one UPDATE; the others each by its attempt's own move (WITH ... INSERT)"
