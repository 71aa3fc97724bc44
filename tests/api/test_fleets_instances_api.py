"""Fleets, instances, instance groups (TPU pods) and events over the REST API."""

from __future__ import annotations

import ipaddress
import threading

import pytest

from instances.models import Fleet, Instance, InstanceGroup
from tests.conftest import client_for, example
from tests.waiting import wait_until

pytestmark = pytest.mark.django_db

BASE = "/api/projects/main"


def apply_fleet(api, configuration, project="main"):
    return api.post(f"/api/projects/{project}/fleets/", {"configuration": configuration}, format="json")


# ---- fleets -----------------------------------------------------------------------------------


def test_the_local_fleet_example_creates_four_idle_loopback_instances(api, superuser_api):
    resp = apply_fleet(superuser_api, example("local-fleet.yml"))
    assert resp.status_code == 201, resp.json()
    body = resp.json()
    assert body["name"] == "local2"
    assert body["backend"] == "local"
    assert body["placement"] == "cluster"
    assert len(body["instances"]) == 4

    rows = api.get(f"{BASE}/instances/?fleet=local2").json()
    assert len(rows) == 4
    for row in rows:
        assert row["fleet"] == "local2"
        assert row["status"] == "idle"
        assert row["group"] is None
        assert isinstance(row["index"], int)
        address = ipaddress.ip_address(row["internal_ip"])
        assert address.is_loopback, row["internal_ip"]
        assert str(address) != "127.0.0.1", "127.0.0.1 stays the server's own address"
    assert len({r["internal_ip"] for r in rows}) == 4, "every instance has its own address"
    assert sorted(r["name"] for r in rows) == [f"local2-{i}" for i in range(4)]


def test_a_fleet_key_that_takes_no_effect_is_said_in_the_answer_to_the_apply(superuser_api):
    resp = apply_fleet(superuser_api, "type: fleet\nname: warned\nbackends: [local]\nnodes: 1\nspot_policy: spot\n"
                                      "env: [A=1]\n")
    assert resp.status_code == 201, resp.json()
    fields = {w["field"]: w["message"] for w in resp.json()["warnings"]}
    assert set(fields) == {"spot_policy", "env"}, fields
    assert "ignored" in fields["spot_policy"] and "not passed to jobs" in fields["env"]
    assert "warnings" not in superuser_api.get(f"{BASE}/fleets/warned/").json()  # said once, not stored


def test_a_second_local_fleet_gets_addresses_the_first_does_not_use(api, superuser_api):
    assert apply_fleet(superuser_api, example("local-fleet.yml")).status_code == 201
    other = "type: fleet\nname: other\nbackends: [local]\nnodes: 2\n"
    assert apply_fleet(superuser_api, other).status_code == 201
    first = {r["internal_ip"] for r in api.get(f"{BASE}/instances/?fleet=local2").json()}
    second = {r["internal_ip"] for r in api.get(f"{BASE}/instances/?fleet=other").json()}
    assert len(second) == 2
    assert not first & second


def test_a_fleet_name_used_twice_is_a_400_on_name(api, superuser_api):
    assert apply_fleet(superuser_api, example("local-fleet.yml")).status_code == 201
    resp = apply_fleet(superuser_api, example("local-fleet.yml"))
    assert resp.status_code == 400
    errors = resp.json()["errors"]
    assert errors[0]["loc"] == ["name"]
    assert "local2" in errors[0]["msg"]
    assert Fleet.objects.filter(name="local2").count() == 1
    assert Instance.objects.filter(fleet__name="local2").count() == 4


def test_an_unknown_key_in_a_fleet_is_a_400_naming_it(api):
    resp = apply_fleet(api, "type: fleet\nname: f1\nbackends: [local]\nnodez: 2\n")
    assert resp.status_code == 400
    errors = resp.json()["errors"]
    assert errors == [{"loc": ["nodez"], "msg": "unknown key `nodez`: did you mean `nodes`?"}]
    assert not Fleet.objects.exists()


def test_a_task_sent_to_fleets_is_refused(api):
    resp = apply_fleet(api, "type: task\ncommands: [echo]\n")
    assert resp.status_code == 400
    assert resp.json()["errors"][0]["loc"] == ["type"]


def test_fleets_list_and_detail_show_the_fleet(api, superuser_api):
    apply_fleet(superuser_api, example("local-fleet.yml"))
    listed = api.get(f"{BASE}/fleets/").json()
    assert [f["name"] for f in listed] == ["local2"]
    assert [i["name"] for i in listed[0]["instances"]] == [f"local2-{i}" for i in range(4)]
    detail = api.get(f"{BASE}/fleets/local2/")
    assert detail.status_code == 200
    assert detail.json()["configuration"]["nodes"] == 4
    assert api.get(f"{BASE}/fleets/nope/").status_code == 404


def test_the_fleet_api_never_returns_a_private_key(api):
    resp = apply_fleet(api, example("tpu-fleet.yml"))
    assert resp.status_code == 201, resp.json()
    assert "private_key" not in resp.content.decode()
    for url in (f"{BASE}/fleets/", f"{BASE}/fleets/tpu/"):
        text = api.get(url).content.decode()
        assert "tpu" in text
        assert "private_key" not in text


def test_a_stored_ssh_key_is_stripped_from_the_fleet_configuration_shown(api, project):
    # The configuration a fleet row holds may still carry keys (fleet- and host-level): the API strips them.
    fleet = Fleet.objects.create(
        project=project, name="ssh1", backend="ssh",
        configuration={"type": "fleet", "name": "ssh1", "ssh_config": {
            "private_key": "FLEET-KEY-MATERIAL",
            "hosts": [{"hostname": "10.0.0.10", "port": 22, "user": "ubuntu", "private_key": "HOST-KEY-MATERIAL"}],
        }},
    )
    fleet.private_key = "ENCRYPTED-KEY-MATERIAL"
    fleet.save()
    text = api.get(f"{BASE}/fleets/ssh1/").content.decode()
    assert "10.0.0.10" in text
    for secret in ("private_key", "KEY-MATERIAL", fleet.private_key_encrypted):
        assert secret not in text


@pytest.mark.django_db(transaction=True)
def test_deleting_a_fleet_answers_at_once_and_a_worker_stops_and_terminates_its_instances(
        api, superuser_api, celery_worker, monkeypatch):
    from engine import groups

    apply_fleet(superuser_api, example("local-fleet.yml"))
    stopped = []
    stop_agents = groups.stop_agents
    # who stops the agents: never the request (its thread is this one), always a worker's step

    def watched(instances):
        stopped.append((threading.current_thread(), sorted(i.name for i in instances)))
        stop_agents(instances)

    monkeypatch.setattr(groups, "stop_agents", watched)
    resp = api.delete(f"{BASE}/fleets/local2/")
    assert resp.status_code == 202, resp.content
    assert resp.json()["status"] == "terminating" and resp.json()["name"] == "local2"
    assert all(thread is not threading.current_thread() for thread, _ in stopped), "no host I/O in the request"
    wait_until(lambda: api.get(f"{BASE}/fleets/").json() == [], 60, "the fleet deleted by its step")
    assert [names for _, names in stopped] == [[f"local2-{i}" for i in range(4)]]
    assert not any(thread is threading.current_thread() for thread, _ in stopped)
    assert api.get(f"{BASE}/instances/").json() == [], "terminated instances are hidden by default"
    ended = api.get(f"{BASE}/instances/?status=terminated").json()
    assert sorted(r["name"] for r in ended) == [f"local2-{i}" for i in range(4)]
    assert all(r["status"] == "terminated" for r in ended)


def test_an_unknown_instance_status_filter_is_a_400(api):
    resp = api.get(f"{BASE}/instances/?status=sleeping")
    assert resp.status_code == 400
    assert resp.json()["errors"][0]["loc"] == ["status"]


def test_a_reader_cannot_create_or_delete_fleets(api, superuser_api, make_user):
    apply_fleet(superuser_api, example("local-fleet.yml"))
    reader = client_for(make_user("rita", role="read-only"))
    assert reader.get(f"{BASE}/fleets/").status_code == 200
    assert apply_fleet(reader, "type: fleet\nname: f2\nbackends: [local]\nnodes: 1\n").status_code == 403
    assert reader.delete(f"{BASE}/fleets/local2/").status_code == 403
    assert Fleet.objects.filter(name="local2").exists()


# ---- instance groups (a TPU pod made with the ORM: creating one for real needs the gcp backend) --


@pytest.fixture
def tpu_pod(project):
    fleet = Fleet.objects.create(project=project, name="tpu", backend="gcp", configuration={})
    group = InstanceGroup.objects.create(
        project=project, fleet=fleet, name="pod-a1", kind="tpu_pod", shape="v2-32", status="active",
        backend_data={"backend": "gcp"},
    )
    # Created out of order, so an ordered answer is the API's doing.
    for index in (2, 0, 3, 1):
        Instance.objects.create(
            project=project, fleet=fleet, group=group, index=index, name=f"pod-a1-{index}", status="idle",
            backend="gcp", internal_ip=f"10.1.0.{10 + index}",
        )
    return group


def test_instance_groups_list_shows_a_pod_with_its_hosts_in_worker_order(api, tpu_pod):
    groups = api.get(f"{BASE}/instance-groups/").json()
    assert [g["name"] for g in groups] == ["pod-a1"]
    pod = groups[0]
    assert pod["kind"] == "tpu_pod"
    assert pod["shape"] == "v2-32"
    assert pod["fleet"] == "tpu"
    assert [i["index"] for i in pod["instances"]] == [0, 1, 2, 3]
    assert [i["name"] for i in pod["instances"]] == [f"pod-a1-{k}" for k in range(4)]
    assert [i["internal_ip"] for i in pod["instances"]] == [f"10.1.0.{10 + k}" for k in range(4)]


def test_a_group_is_found_by_its_name_or_a_member_name(api, tpu_pod):
    by_group = api.get(f"{BASE}/instance-groups/pod-a1/")
    by_member = api.get(f"{BASE}/instance-groups/pod-a1-2/")
    assert by_group.status_code == by_member.status_code == 200
    assert by_group.json() == by_member.json()


def test_instances_filter_by_group(api, tpu_pod, project):
    Instance.objects.create(project=project, name="loose", status="idle", backend="local", internal_ip="127.0.0.9")
    rows = api.get(f"{BASE}/instances/?group=pod-a1").json()
    assert [(r["name"], r["index"], r["group"], r["group_kind"]) for r in rows] == [
        (f"pod-a1-{k}", k, "pod-a1", "tpu_pod") for k in range(4)
    ]
    everything = api.get(f"{BASE}/instances/").json()
    assert {r["name"] for r in everything} == {"loose", *(f"pod-a1-{k}" for k in range(4))}


def test_deleting_an_unknown_group_is_a_404(api, tpu_pod):
    assert api.delete(f"{BASE}/instance-groups/no-such-pod/").status_code == 404
    tpu_pod.refresh_from_db()
    assert tpu_pod.status == "active"


def test_deleting_a_pod_by_a_member_name_marks_the_whole_pod_terminating(api, tpu_pod,
                                                                         django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks() as callbacks:
        resp = api.delete(f"{BASE}/instance-groups/pod-a1-3/")
    assert resp.status_code == 202, resp.json()
    body = resp.json()
    assert body["name"] == "pod-a1"
    assert body["status"] == "terminating"
    assert [i["status"] for i in body["instances"]] == ["terminating"] * 4
    tpu_pod.refresh_from_db()
    assert tpu_pod.status == "terminating"
    assert set(tpu_pod.instances.values_list("status", flat=True)) == {"terminating"}
    # The backend delete is one Celery task, enqueued only once the transaction commits. It is not
    # run here: the gcp backend needs a TPU API server (tests/gcp covers the real delete).
    assert len(callbacks) == 1
    assert "terminate_group" in callbacks[0].__code__.co_names
    events = api.get(f"{BASE}/events/").json()
    assert any(e["subject"] == "instance group pod-a1" and e["status"] == "terminating" for e in events)


def test_deleting_a_pod_twice_enqueues_one_backend_delete(api, tpu_pod, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks() as callbacks:
        assert api.delete(f"{BASE}/instance-groups/pod-a1/").status_code == 202
        assert api.delete(f"{BASE}/instance-groups/pod-a1-0/").status_code == 202
    assert len(callbacks) == 1


def test_a_reader_cannot_delete_a_pod(api, tpu_pod, make_user):
    reader = client_for(make_user("rita", role="read-only"))
    assert reader.get(f"{BASE}/instance-groups/pod-a1/").status_code == 200
    resp = reader.delete(f"{BASE}/instance-groups/pod-a1/")
    assert resp.status_code == 403
    tpu_pod.refresh_from_db()
    assert tpu_pod.status == "active"
    assert set(tpu_pod.instances.values_list("status", flat=True)) == {"idle"}


def test_a_member_of_another_project_does_not_see_the_pod(api, tpu_pod, make_user):
    stranger = client_for(make_user("mallory", project="other"))
    assert stranger.get(f"{BASE}/instance-groups/pod-a1/").status_code == 404
    assert stranger.get("/api/projects/other/instance-groups/pod-a1/").status_code == 404
    assert stranger.get("/api/projects/other/instance-groups/").json() == []
    assert stranger.get("/api/projects/other/instances/").json() == []


# ---- events -----------------------------------------------------------------------------------


def test_submitting_a_run_records_a_submitted_event(api):
    resp = api.post(f"{BASE}/runs/", {"configuration": "type: task\nname: ev1\nnodes: 2\ncommands: [echo]\n"},
                    format="json")
    assert resp.status_code == 201, resp.json()
    api.post(f"{BASE}/runs/", {"configuration": "type: task\nname: ev2\ncommands: [echo]\n"}, format="json")
    events = api.get(f"{BASE}/events/?run=ev1").json()
    assert events, "the run has events"
    assert {e["run"] for e in events} == {"ev1"}
    submitted = [e for e in events if e["status"] == "submitted"]
    assert len(submitted) == 1
    assert submitted[0]["subject"] == "run ev1"
    assert submitted[0]["actor"] == "alice"
    assert "2 jobs" in submitted[0]["message"]


@pytest.mark.parametrize("bad", ["not a key", "ssh-ed25519 !!notbase64", "ssh-ed25519 " + "QUFBQQ==",
                                 "[h]:22 ssh-rsa"])
def test_a_malformed_host_key_is_a_400_before_any_contact(api, bad):
    conf = {"type": "fleet", "name": "pd", "ssh_config": {
        "user": "root", "private_key": "x", "hosts": [{"hostname": "192.0.2.1", "host_key": bad}]}}
    resp = apply_fleet(api, conf)
    assert resp.status_code == 400
    (error,) = resp.json()["errors"]
    assert error["loc"] == ["ssh_config", "hosts", 0, "host_key"] and "host_key" in error["msg"]
    assert not Fleet.objects.exists()
