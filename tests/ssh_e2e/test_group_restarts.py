"""`on_failure` end to end: real sshd hosts in network namespaces, a real worker and beat, runs
submitted and read through the REST API.

A node's first attempt fails by leaving a mark in its host's runner home (`$MUSTER_HOME`, one per
host, outliving the job directory), so its restart finds the mark and goes on.
"""

from __future__ import annotations

import pytest

from events.models import Event
from instances.models import Instance
from instances.services.fleets import apply_fleet
from runs.models import Job, Run
from runs.services import logs
from tests.engine.helpers import wait_for_run
from tests.ssh_e2e.helpers import Beat, fleet_configuration, needs_netns
from tests.waiting import job_states, wait_until

pytestmark = [*needs_netns, pytest.mark.django_db(transaction=True), pytest.mark.slow]

RUNS = "/api/projects/main/runs/"
# fails the first time it runs on a host with status $1, then succeeds
FAIL_ONCE = ('m="$MUSTER_HOME/failed-once-$DSTACK_RUN_NAME-$DSTACK_NODE_RANK"; '
             'if [ ! -e "$m" ]; then touch "$m"; echo "first attempt on $DSTACK_NODE_IP"; exit {code}; fi')


@pytest.fixture
def fast_limits(fast_limits, settings):
    # The watch of the nodes left running is sent every JOB_POLL_INTERVAL whatever it costs; under
    # a loaded machine's slow SSH a 0.2 s interval queues watches faster than the worker does
    # them, and the restarted group's start waits behind that line.
    settings.MUSTER = {**settings.MUSTER, "JOB_POLL_INTERVAL": 2.0}
    return settings.MUSTER


@pytest.fixture
def beat(celery_worker):
    with Beat() as beat:
        yield beat


@pytest.fixture
def hosts(ssh_hosts, api):
    from projects.models import Project

    pool = ssh_hosts(4, mode="netns")
    apply_fleet(Project.objects.get(name="main"), {"configuration": fleet_configuration(pool, name="f")}, actor="test")
    return pool


def submit(api, text: str) -> Run:
    resp = api.post(RUNS, {"configuration": text}, format="json")
    assert resp.status_code == 201, resp.json()
    return Run.objects.get(name=resp.json()["name"])


def ended(run: Run, timeout: float) -> Run:
    """The run once it has ended; on a timeout, the error carries the run's events."""
    try:
        return wait_for_run(run.name, timeout=timeout)
    except AssertionError as exc:
        said = Event.objects.filter(run=run).values_list("created", "subject", "message")
        raise AssertionError("\n".join([str(exc), *(f"{c:%H:%M:%S} {s}: {m}" for c, s, m in said)])) from None


def rows(run: Run, group: str) -> list[Job]:
    return list(Job.objects.filter(run=run, node_group_name=group).order_by("submission_num", "job_num"))


def no_host_busy() -> bool:
    return not Instance.objects.filter(status="busy").exists()


def test_restart_group_on_an_error_restarts_only_that_group_on_the_same_host_and_the_run_ends_done(
        hosts, api, beat, fast_limits):
    run = submit(api, f"""
type: task
name: same-host
fleets: [f]
groups:
  - name: head
    commands: [echo "head at $DSTACK_NODE_IP", sleep 6]
  - name: worker
    on_failure: restart-group
    commands:
      - {FAIL_ONCE.format(code=3)}
      - echo "worker again at $DSTACK_NODE_IP; nodes $(echo $DSTACK_NODES_IPS | tr '\\n' ' ')"
""")
    run = ended(run, 90)
    assert run.status == "done", job_states(run)
    head, (first, second) = rows(run, "head"), rows(run, "worker")
    assert [(j.submission_num, j.status) for j in head] == [(0, "done")]  # never stopped
    assert (first.submission_num, first.status, first.exit_status, first.superseded) == (0, "failed", 3, True)
    assert (second.submission_num, second.status, second.superseded) == (1, "done", False)
    assert second.instance_id == first.instance_id
    ip = first.instance.internal_ip
    assert f"worker again at {ip}" in logs.read(second).decode()
    # the REST answer: the current rows, the worker's new submission beside the head's first one
    answer = api.get(f"{RUNS}{run.name}/").json()
    assert [(j["node_group_name"], j["submission_num"], j["instance_ip"]) for j in answer["jobs"]] == [
        ("head", 0, head[0].instance.internal_ip), ("worker", 1, ip)]
    said = list(Event.objects.filter(run=run).values_list("message", flat=True))
    assert any("group worker restarts (1 of 3)" in m and "on the same hosts" in m for m in said), said
    assert any("kept busy by job same-host/1" in m for m in said), said
    # the host stayed busy from the failure to the restart: handed back once, by the second attempt
    handed = Event.objects.filter(instance_id=first.instance_id, message__startswith="given back")
    assert list(handed.values_list("job_id", flat=True)) == [second.pk]
    wait_until(no_host_busy, 20, "every host handed back")


def test_a_group_that_always_fails_stops_after_max_restarts_plus_one_attempts(hosts, api, beat, fast_limits):
    run = submit(api, """
type: task
name: always-fails
fleets: [f]
groups:
  - name: head
    commands: [sleep 600]
  - name: worker
    max_restarts: 2
    on_failure: [{on_events: [error], action: restart-group}]
    commands: [exit 1]
""")
    run = ended(run, 120)
    assert (run.status, run.termination_reason) == ("failed", "retry_limit_exceeded"), job_states(run)
    attempts = rows(run, "worker")
    assert [j.submission_num for j in attempts] == [0, 1, 2]
    assert all(j.status == "failed" and j.exit_status == 1 for j in attempts), job_states(run)
    assert len({j.instance_id for j in attempts}) == 1
    head = rows(run, "head")[0]
    assert (head.status, head.termination_reason) == ("terminated", "terminated_by_server"), \
        "\n".join(f"{c:%H:%M:%S.%f} {s}: {m}" for c, s, m in Event.objects.filter(run=run).values_list(
            "created", "subject", "message"))
    wait_until(no_host_busy, 20, "every host handed back, the kept one too")


def test_a_listed_exit_code_restarts_the_group_and_another_falls_through_to_fail_run(
        hosts, api, beat, fast_limits):
    run = submit(api, f"""
type: task
name: exit-codes
fleets: [f]
groups:
  - name: head
    commands: [sleep 600]
  - name: worker
    on_failure:
      - {{on_exit_codes: [42], action: restart-group}}
    commands:
      - {FAIL_ONCE.format(code=42)}
      - exit 1
""")
    run = ended(run, 90)
    assert (run.status, run.termination_reason) == ("failed", "job_failed"), job_states(run)
    assert [(j.submission_num, j.exit_status) for j in rows(run, "worker")] == [(0, 42), (1, 1)]
    wait_until(no_host_busy, 20, "every host handed back")


IGNORING = """
type: task
name: {name}
fleets: [f]
groups:
  - name: head
    commands: [sleep 5]
  - name: workers
    nodes: 3
    on_failure: ignore
    commands:
      - if [ "$DSTACK_NODE_GROUP_RANK" = 1 ] || [ {all_fail} = 1 ]; then exit 7; fi
      - sleep 2
"""


def test_ignore_lets_the_run_finish_without_a_failed_worker_but_not_without_all_of_them(
        hosts, api, beat, fast_limits):
    run = ended(submit(api, IGNORING.format(name="one-fails", all_fail=0)), 90)
    assert run.status == "done", job_states(run)
    workers = rows(run, "workers")
    assert [(j.node_group_rank, j.status) for j in workers] == [(0, "done"), (1, "failed"), (2, "done")]
    assert [j.submission_num for j in workers] == [0, 0, 0]  # left failed, not restarted
    wait_until(no_host_busy, 20, "every host handed back")

    run = ended(submit(api, IGNORING.format(name="all-fail", all_fail=1)), 90)
    assert (run.status, run.termination_reason) == ("failed", "job_failed"), job_states(run)
    assert {j.status for j in rows(run, "workers")} == {"failed"}
    wait_until(no_host_busy, 20, "every host handed back")


def test_a_group_whose_host_is_lost_moves_to_an_idle_host_and_the_group_naming_it_restarts(
        hosts, api, beat, fast_limits):
    run = submit(api, """
type: task
name: moves
fleets: [f]
groups:
  - name: head
    commands: [sleep 600]
  - name: worker
    on_failure: restart-group
    commands: [echo "worker at $DSTACK_NODE_IP", sleep 600]
  - name: client
    commands:
      - echo "client sees ${{ groups[1].nodes[0].IP_ADDRESS }}"
      - sleep 600
""")
    wait_until(lambda: all(j.status == "running" for j in run.current_jobs()), 90, "all three nodes running")
    (head,), (lost,), (client,) = rows(run, "head"), rows(run, "worker"), rows(run, "client")
    victim = next(h for h in hosts if h.address == lost.instance.internal_ip)
    victim.stop_sshd()
    victim.kill_processes()

    def moved():
        current = {j.node_group_name: j for j in run.current_jobs().select_related("instance")}
        return current if all(j.status == "running" and j.submission_num == 1
                              for j in (current["worker"], current["client"])) else None

    current = wait_until(moved, 120, "worker and client running again")
    lost.refresh_from_db()
    assert (lost.status, lost.termination_reason) == ("failed", "instance_unreachable")
    assert current["worker"].instance_id not in (lost.instance_id, head.instance_id, client.instance_id)
    assert current["client"].instance_id == client.instance_id  # on its own host, with the new address
    new_ip = current["worker"].instance.internal_ip
    wait_until(lambda: f"client sees {new_ip}" in logs.read(current["client"]).decode(), 30, "the client's log")
    assert f"client sees {lost.instance.internal_ip}" in logs.read(client).decode()
    assert (current["head"].pk, current["head"].status) == (head.pk, "running")  # never stopped
    said = list(Event.objects.filter(run=run).values_list("message", flat=True))
    assert any("group worker restarts (1 of 3)" in m and "on new hosts" in m for m in said), said
    assert any("group client restarts with group 1" in m for m in said), said

    assert api.post(f"{RUNS}{run.name}/stop", {}, format="json").status_code in (200, 202)
    run = ended(run, 60)
    assert run.status == "terminated", job_states(run)
    wait_until(no_host_busy, 20, "every host handed back")
