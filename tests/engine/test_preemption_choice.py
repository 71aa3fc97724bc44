"""The greedy choice of which preemptible runs to stop (engine/submitted/preemption.py `choose`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from engine.submitted.preemption import Candidate, choose

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def c(run_id: int, priority: int, hosts: int, age: int = 0) -> Candidate:
    return Candidate(run_id, f"r{run_id}", priority, T0 - timedelta(minutes=age), hosts)


def ids(chosen: list[Candidate]) -> list[int]:
    return sorted(x.run_id for x in chosen)


def test_the_lowest_priority_goes_first_and_a_higher_one_only_when_needed():
    assert ids(choose([c(1, 40, 2), c(2, 10, 2)], 2)) == [2]
    assert ids(choose([c(1, 40, 2), c(2, 10, 2)], 3)) == [1, 2]


def test_the_fewest_runs_within_a_priority():
    assert ids(choose([c(1, 10, 1), c(2, 10, 1), c(3, 10, 2)], 2)) == [3]


def test_a_run_a_later_larger_choice_covers_is_let_off():
    # r1 (priority 5, 1 host) is taken first, then r2 (priority 20, 4 hosts) covers the whole need alone
    assert ids(choose([c(1, 5, 1), c(2, 20, 4)], 4)) == [2]


def test_the_newest_of_equals_goes_first():
    assert ids(choose([c(1, 10, 2, age=30), c(2, 10, 2, age=1)], 2)) == [2]


def test_nothing_is_stopped_when_all_of_them_would_not_free_enough_or_nothing_is_needed():
    assert choose([c(1, 10, 1), c(2, 10, 1)], 3) == []
    assert choose([c(1, 10, 1)], 0) == []


def r(run_id: int, project: int, hosts: int, priority: int = 0, age: int = 0) -> Candidate:
    return Candidate(run_id, f"r{run_id}", priority, T0 - timedelta(minutes=age), hosts, project_id=project,
                     frees={"hosts": hosts, "gpus": 0})


def test_a_reclaim_never_brings_a_project_below_its_quota():
    # project 7 holds 1 host above its quota: its 2-host run may not be stopped, its 1-host run may
    assert choose([r(1, 7, 2)], 1, room={7: {"hosts": 1}}) == []
    assert ids(choose([r(1, 7, 2), r(2, 7, 1)], 1, room={7: {"hosts": 1}})) == [2]
    # two 1-host runs of a project 1 above its quota: one only, so 2 hosts need another project's too
    assert ids(choose([r(1, 7, 1), r(2, 7, 1), r(3, 8, 1, priority=5)], 2,
                      room={7: {"hosts": 1}, 8: {"hosts": 3}})) == [2, 3]
    # a project with no room (not borrowing) is never a victim
    assert choose([r(1, 9, 1)], 1, room={7: {"hosts": 1}}) == []
