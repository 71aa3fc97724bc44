"""What a run's containers may do to a fleet's hosts, through the plan and submit API: `image` is a
Docker reference (never a flag), and `privileged` and host volumes only where the fleet's operator
allows them (`allow_privileged`, `volumes.allowed_prefixes`). Fleets are real SSH fleets on real
sshd hosts; no Docker is needed, since every refusal here comes before a job is placed."""

from __future__ import annotations

import pytest

from projects.models import Project
from runs.models import Run
from tests.conftest import client_for
from tests.ssh_e2e.helpers import fleet_configuration, registered_fleet

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = "/api/projects/main/runs/"
FLEETS = "/api/projects/main/fleets/"


def plan(client, configuration):
    return client.post(RUNS + "plan", {"configuration": configuration}, format="json")


def errors_of(resp) -> dict[tuple, str]:
    assert resp.status_code == 400, resp.json()
    return {tuple(e["loc"]): e["msg"] for e in resp.json()["errors"]}


# ---- 6b: image is a Docker reference ----------------------------------------------------------

HOSTILE_IMAGES = ["--privileged", "-v/:/h", "UPPER/case", "", " ", "busybox latest", "a" * 300,
                  "busybox:" + "t" * 129, "busybox@sha256:xyz"]


@pytest.mark.parametrize("image", HOSTILE_IMAGES)
def test_a_hostile_or_malformed_image_is_a_400_at_image_naming_the_form(api, image):
    found = errors_of(plan(api, {"type": "task", "image": image, "commands": ["true"]}))
    assert list(found) == [("image",)], found
    assert "[registry[:port]/]path[:tag][@digest]" in found[("image",)] or "limit" in found[("image",)] \
        or "tag" in found[("image",)] or "digest" in found[("image",)], found
    assert len(found[("image",)]) < 600, "an oversized value is not echoed back whole"


@pytest.mark.parametrize("image", ["--privileged", "-v/:/h", "UPPER/case", ""])
def test_a_hostile_group_image_is_a_400_at_its_group(api, image):
    conf = {"type": "task", "groups": [{"name": "ok", "image": "busybox", "commands": ["true"]},
                                       {"name": "bad", "image": image, "commands": ["true"]}]}
    assert list(errors_of(plan(api, conf))) == [("groups", 1, "image")]


def test_a_hostile_image_is_refused_at_submit_and_no_run_is_made(api):
    resp = api.post(RUNS, {"configuration": {"type": "task", "image": "--privileged", "commands": ["id"]}},
                    format="json")
    assert ("image",) in errors_of(resp)
    assert Run.objects.count() == 0


@pytest.mark.parametrize("image", ["ghcr.io/a/b:1.2", "localhost:5000/x@sha256:" + "0123456789abcdef" * 4,
                                   "busybox", "ubuntu:22.04", "127.0.0.1:5000/test/worker", "nvcr.io/nvidia/pytorch:24.05-py3",
                                   "my_org/my-image__x.y:v1_2", "[::1]:5000/x:1"])
def test_a_valid_image_plans(api, image):
    resp = plan(api, {"type": "task", "image": image, "commands": ["true"]})
    assert resp.status_code == 200, resp.json()
    assert resp.json()["configuration"]["image"] == image


# ---- 6d: privileged and host volumes, by the fleet's policy -------------------------------------


@pytest.fixture(scope="module")
def hosts(ssh_hosts_session):
    return ssh_hosts_session(2)


@pytest.fixture
def member(make_user):
    """A member with role `user`: may submit runs, is not the fleet's operator."""
    return client_for(make_user("mallory", role="user"))


@pytest.fixture
def locked(api, hosts):
    """An SSH fleet as an operator writes it without the new keys: the defaults."""
    project = Project.objects.get(name="main")
    registered_fleet(project, {"configuration": fleet_configuration(hosts, "locked", hosts=[hosts[0]])}, actor="test")
    return project


@pytest.fixture
def fleets(locked, hosts):
    """`locked`, and `open`, which allows privileged and /data, /scratch."""
    project = locked
    opened = {**fleet_configuration(hosts, "open", hosts=[hosts[1]]), "allow_privileged": True,
              "volumes": {"allowed_prefixes": ["/data", "/scratch/"]}}
    registered_fleet(project, {"configuration": opened}, actor="test")
    return project


ROOT_MOUNT = {"type": "task", "name": "peek", "image": "busybox", "volumes": ["/:/host"],
              "commands": ["cat /host/etc/shadow"]}


def test_a_member_cannot_mount_the_hosts_root_on_a_fleet_that_allows_no_host_paths(locked, member):
    resp = member.post(RUNS, {"configuration": {**ROOT_MOUNT, "fleets": ["locked"]}}, format="json")
    found = errors_of(resp)
    assert list(found) == [("volumes", 0)], found
    assert "fleet locked does not allow mounting host path `/`" in found[("volumes", 0)]
    assert "allowed_prefixes are none" in found[("volumes", 0)]
    assert Run.objects.count() == 0, "nothing of a refused run is kept"
    assert ("volumes", 0) in errors_of(plan(member, {**ROOT_MOUNT, "fleets": ["locked"]}))


@pytest.mark.parametrize("volume", ["/:/host", "/etc:/e", "/data/../etc:/e", "/database:/d", "//etc:/e",
                                    "/scratch/../../etc:/e"])
def test_a_host_path_outside_the_prefixes_is_refused_even_where_host_paths_are_allowed(fleets, member, volume):
    conf = {"type": "task", "image": "busybox", "volumes": [volume], "commands": ["true"], "fleets": ["open"]}
    found = errors_of(plan(member, conf))
    assert list(found) == [("volumes", 0)], found
    assert "its volumes.allowed_prefixes are /data, /scratch" in found[("volumes", 0)]


@pytest.mark.parametrize("volume", ["/data:/d", "/data/models:/m", "/scratch/a/../b:/b",
                                    {"instance_path": "/data/x", "path": "/x"}])
def test_a_host_path_under_a_prefix_plans_on_the_fleet_that_allows_it(fleets, member, volume):
    conf = {"type": "task", "image": "busybox", "volumes": [volume], "commands": ["true"], "fleets": ["open"]}
    assert plan(member, conf).status_code == 200, plan(member, conf).json()


PRIVILEGED = {"type": "task", "image": "busybox", "privileged": True, "commands": ["true"]}


def test_privileged_is_refused_on_an_ssh_fleet_by_default(locked, member):
    found = errors_of(member.post(RUNS, {"configuration": {**PRIVILEGED, "fleets": ["locked"]}}, format="json"))
    assert list(found) == [("privileged",)], found
    assert "fleet locked does not allow privileged containers" in found[("privileged",)]
    assert Run.objects.count() == 0


def test_privileged_plans_on_a_fleet_that_allows_it(fleets, member):
    assert plan(member, {**PRIVILEGED, "fleets": ["open"]}).status_code == 200


def test_a_run_that_one_candidate_fleet_allows_is_accepted_and_never_placed_on_the_other(fleets, member):
    conf = {"type": "task", "image": "busybox", "privileged": True, "volumes": ["/data/in:/in"],
            "commands": ["true"]}
    for named in ([], ["locked", "open"]):
        resp = plan(member, {**conf, "fleets": named})
        assert resp.status_code == 200, resp.json()
        capacity = resp.json()["capacity"]
        assert capacity["fleet"] in (None, "open"), capacity
        # these hosts have no Docker, so nothing fits now; the plan says why locked is out anyway
        assert "fleet locked does not allow privileged containers" in " ".join(capacity["reasons"]), capacity
    from instances import fitting

    allowed = fitting.allowing_fleets(fitting.fleets_for(fleets.pk, []),
                                      {"image": "busybox", "container": {"privileged": True}})
    assert [f.name for f in allowed] == ["open"]


def test_without_an_image_privileged_and_volumes_are_not_checked_they_do_nothing(fleets, member):
    conf = {"type": "task", "privileged": True, "volumes": ["/:/host"], "commands": ["true"], "fleets": ["locked"]}
    resp = plan(member, conf)
    assert resp.status_code == 200, resp.json()
    assert "volumes" in {w["field"] for w in resp.json()["warnings"]}


def test_the_fleet_keys_are_checked_and_shown(api, fleets):
    shown = api.get(FLEETS + "open/").json()
    assert shown["configuration"]["allow_privileged"] is True, shown
    assert shown["configuration"]["volumes"] == {"allowed_prefixes": ["/data", "/scratch"]}
    assert api.get(FLEETS + "locked/").json()["configuration"]["allow_privileged"] is False
    bad = {"type": "fleet", "name": "bad", "backends": ["gcp"], "resources": {"gpu": "v5litepod-4"},
           "allow_privileged": False, "volumes": {"allowed_prefixes": ["data", "/a:b"]}}
    found = errors_of(api.post(FLEETS, {"configuration": bad}, format="json"))
    assert set(found) == {("allow_privileged",), ("volumes", "allowed_prefixes", 0),
                          ("volumes", "allowed_prefixes", 1)}, found
    assert "TPU" in found[("allow_privileged",)]
    gcp = {"type": "fleet", "name": "tpus", "backends": ["gcp"], "resources": {"gpu": "v5litepod-4"}}
    resp = api.post(FLEETS, {"configuration": gcp}, format="json")
    assert resp.status_code == 201, resp.json()
    assert resp.json()["configuration"]["allow_privileged"] is True, "TPU containers need it: gcp's default"


def test_a_local_fleet_keeps_its_policy_and_defaults_to_neither(superuser_api):
    opened = {"type": "fleet", "name": "here", "backends": ["local"], "nodes": 1, "allow_privileged": True,
              "volumes": {"allowed_prefixes": ["/srv/data"]}}
    assert superuser_api.post(FLEETS, {"configuration": opened}, format="json").status_code == 201
    assert superuser_api.post(FLEETS, {"configuration": {"type": "fleet", "name": "plain", "backends": ["local"],
                                                         "nodes": 1}}, format="json").status_code == 201
    from instances import fitting

    fleets = fitting.fleets_for(Project.objects.get(name="main").pk, [])
    wants = {"image": "busybox", "container": {"privileged": True, "volumes": [
        {"instance_path": "/srv/data/x", "path": "/x", "optional": False}]}}
    assert [f.name for f in fitting.allowing_fleets(fleets, wants)] == ["here"]
