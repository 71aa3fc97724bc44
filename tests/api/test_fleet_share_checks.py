"""A fleet's sharing keys refused at the API (docs/queueing.md, "Shared fleets"): each bad share is a
400 naming the field, and nothing is created (no fleet, no host, no share). Nothing is contacted:
the checks come before the hosts are."""

from __future__ import annotations

import pytest

from instances.models import Fleet, FleetShare, Instance
from projects.models import Project

pytestmark = pytest.mark.django_db

HOSTS = [{"hostname": f"10.254.0.{i}", "port": 22} for i in range(1, 5)]  # never contacted: refused first


def _fleet(**keys) -> dict:
    return {"type": "fleet", "name": "pool", "placement": "cluster",
            "ssh_config": {"user": "root", "private_key": "not-a-key-never-read", "hosts": HOSTS}, **keys}


@pytest.mark.parametrize("keys, loc, words", [
    ({"shared_with": [{"project": "nosuch", "quota": {"hosts": 2}}]}, ["shared_with", 0, "project"],
     "no project named nosuch"),
    ({"shared_with": [{"project": "research", "quota": {"hosts": 1}}, {"project": "main", "quota": {"hosts": 1}}]},
     ["shared_with", 1, "project"], "owns the fleet"),
    ({"shared_with": [{"project": "research", "quota": {"hosts": 1}}, {"project": "research", "quota": {"hosts": 1}}]},
     ["shared_with", 1, "project"], "listed twice"),
    ({"shared_with": [{"project": "research", "quota": {}}]}, ["shared_with", 0, "quota"], "hosts and/or gpus"),
    ({"shared_with": [{"project": "research"}]}, ["shared_with", 0, "quota"], "needs a quota"),
    ({"shared_with": [{"project": "research", "quota": {"hosts": -1}}]}, ["shared_with", 0, "quota", "hosts"],
     "at least 0"),
    ({"quota": {"hosts": 2}, "shared_with": [{"project": "research", "quota": {"hosts": 3}}]}, ["shared_with"],
     "(5 hosts) are above the fleet's 4 hosts"),
    ({"borrowing_limit": {"hosts": 1}}, ["borrowing_limit"], "for a shared fleet"),
])
def test_a_bad_share_is_a_400_naming_the_field_and_nothing_is_created(api, keys, loc, words):
    Project.objects.create(name="research")
    answer = api.post("/api/projects/main/fleets/", {"configuration": _fleet(**keys)}, format="json")
    assert answer.status_code == 400, answer.content
    errors = answer.json()["errors"]
    assert [e["loc"] for e in errors] == [loc], errors
    assert words in errors[0]["msg"], errors
    assert (Fleet.objects.count(), Instance.objects.count(), FleetShare.objects.count()) == (0, 0, 0)


def test_only_a_fleet_of_given_hosts_may_be_shared(api):
    Project.objects.create(name="research")
    conf = {"type": "fleet", "name": "made", "backends": ["local"], "nodes": 2,
            "shared_with": [{"project": "research", "quota": {"hosts": 1}}]}
    answer = api.post("/api/projects/main/fleets/", {"configuration": conf}, format="json")
    assert answer.status_code == 400, answer.content
    assert [e["loc"] for e in answer.json()["errors"]] == [["shared_with"]]
    assert "hosts you have" in answer.json()["errors"][0]["msg"]
    assert Fleet.objects.count() == 0
