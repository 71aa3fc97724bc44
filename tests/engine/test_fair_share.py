"""The rules of shared fleets as plain functions (instances/shares.py): the quota plus what a project
may borrow, and the order freed hosts go in across projects (dominant share, then age: never priority), and who owes a reclaim what."""

from __future__ import annotations

from instances.shares import Share, dominant_share, fair_order, refusal

ONE = {"hosts": 1, "gpus": 0}


def _shares(**quotas) -> dict[int, Share]:
    out = {}
    for i, (name, (hosts, borrow)) in enumerate(sorted(quotas.items()), start=1):
        out[i] = Share(i, name, {"hosts": hosts, "gpus": None}, {"hosts": borrow, "gpus": None})
    return out


def test_a_project_at_its_quota_is_refused_unless_it_may_borrow_what_the_others_leave_idle():
    shares = _shares(alpha=(2, None), beta=(2, None))  # 1: alpha, 2: beta
    totals = {"hosts": 4, "gpus": 0}
    usage = {2: {"hosts": 2, "gpus": 0}}
    assert refusal(2, shares, usage, totals, ONE, "pool") == \
        "quota: project beta holds 2 of its 2 hosts of fleet pool (borrowing: none) and needs 1"
    assert refusal(1, shares, usage, totals, ONE, "pool") == ""
    lending = _shares(alpha=(2, None), beta=(2, 1))
    assert refusal(2, lending, usage, totals, ONE, "pool") == ""
    assert "borrowing: up to 1, 1 free now" in refusal(2, lending, usage, totals, {"hosts": 2, "gpus": 0}, "pool")
    # what alpha uses of its own quota is not lent
    busy = {1: {"hosts": 2, "gpus": 0}, 2: {"hosts": 2, "gpus": 0}}
    assert "0 free now" in refusal(2, lending, busy, totals, ONE, "pool")
    # at all: a run bigger than quota + its whole borrowing limit could never be placed
    assert refusal(2, lending, busy, totals, {"hosts": 3, "gpus": 0}, "pool", at_all=True) == ""
    assert "at most" in refusal(2, lending, busy, totals, {"hosts": 4, "gpus": 0}, "pool", at_all=True)
    assert refusal(3, lending, busy, totals, ONE, "pool").startswith("quota: fleet pool is not shared")


def test_dominant_share_is_the_largest_use_over_quota():
    assert dominant_share({"hosts": 1, "gpus": 6}, {"hosts": 4, "gpus": 8}) == 0.75
    assert dominant_share({"hosts": 3, "gpus": 0}, {"hosts": 2, "gpus": None}) == 1.5
    assert dominant_share({"hosts": 0}, {"hosts": 0}) == 0.0
    assert dominant_share({"hosts": 1}, {"hosts": 0}) == float("inf")


def test_freed_hosts_alternate_by_share_then_age():
    quotas = {1: {"hosts": 2, "gpus": None}, 2: {"hosts": 2, "gpus": None}}
    heads = {1: [(11, ONE, 1.0), (12, ONE, 2.0)], 2: [(21, ONE, 3.0), (22, ONE, 4.0)]}
    # alpha holds 3 of 2, beta 1 of 2: beta first, then level (2 and 2... 3 vs 2): as each pick is counted
    assert fair_order({1: {"hosts": 3}, 2: {"hosts": 1}}, quotas, heads, 4) == [21, 22, 11, 12]
    # level: the older head first, whatever the priorities (priority never decides between projects)
    level = {1: {"hosts": 1}, 2: {"hosts": 1}}
    assert fair_order(level, quotas, {1: [(11, ONE, 1.0)], 2: [(21, ONE, 2.0)]}, 1) == [11]
    assert fair_order(level, quotas, {1: [(11, ONE, 2.0)], 2: [(21, ONE, 1.0)]}, 1) == [21]
    assert fair_order(level, quotas, {1: [(11, ONE, 1.0)], 2: [(21, ONE, 2.0)]}, 2) == [11, 21]
    # no more wakes than hosts, nor than waiting heads
    assert fair_order({}, quotas, heads, 1) == [11]
    assert fair_order({}, quotas, {1: [], 2: [(21, ONE, 1.0)]}, 3) == [21]


def test_a_project_is_owed_hosts_only_within_its_nominal_quota_and_lends_only_what_it_holds_above_it():
    from instances.shares import lent, owed
    share = Share(1, "alpha", {"hosts": 2, "gpus": None}, {"hosts": 2, "gpus": None})
    assert owed(share, {"hosts": 1}, ONE) and owed(share, {}, {"hosts": 2, "gpus": 0})
    assert not owed(share, {"hosts": 2}, ONE), "at its quota: what it wants more is borrowing, not owed"
    assert not owed(Share(1, "x", {"hosts": None, "gpus": None}, {"hosts": None, "gpus": None}), {}, ONE)
    assert lent(share, {"hosts": 4}) == {"hosts": 2}
    assert lent(share, {"hosts": 2}) is None and lent(share, {}) is None, "at or below its quota it lends nothing"
    gpus = Share(1, "g", {"hosts": 2, "gpus": 8}, {"hosts": None, "gpus": None})
    # above on GPUs but at its quota of hosts: every run holds a host, so no run of it may be stopped
    assert lent(gpus, {"hosts": 2, "gpus": 12}) == {"hosts": 0, "gpus": 4}
