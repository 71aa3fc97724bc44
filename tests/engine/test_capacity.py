"""The plan's capacity answer on local fleets: where a run would go, and why it fits nowhere."""

from __future__ import annotations

import pytest

from instances.services.fleets import create_local_fleet

pytestmark = pytest.mark.django_db


def plan(api, text: str) -> dict:
    answer = api.post("/api/projects/main/runs/plan", {"configuration": text}, format="json")
    assert answer.status_code == 200, answer.content
    return answer.json()["capacity"]


def test_a_multi_node_run_is_told_that_a_fleet_without_cluster_placement_cannot_hold_it(api, project):
    create_local_fleet(project, "loose", 2, placement="any")
    assert plan(api, "type: task\ncommands: [echo]\n") == {"fits": True, "fleet": "loose", "reasons": [],
                                                           "fleets": {"default": "loose"},
                                                           "hosts": {"default": ["loose-0", "loose-1"]}}
    assert plan(api, "type: task\nnodes: 2\ncommands: [echo]\n")["reasons"] == [
        "default: needs 2 hosts: fleet loose has placement any: the nodes of a multi-node run need a fleet "
        "with placement: cluster"]


def test_groups_that_each_fit_but_not_together_are_told_so(api, project):
    create_local_fleet(project, "two", 2)
    text = """
type: task
groups:
  - {name: a, nodes: 2, commands: [echo]}
  - {name: b, nodes: 1, commands: [echo]}
"""
    assert plan(api, text)["reasons"] == [
        "fleet two can hold each group on its own but not all 3 nodes at once (a host takes one job): "
        "b is 1 short (needs 1, 0 idle left)"]


def test_a_run_naming_fleets_the_project_does_not_have_is_told_so(api, project):
    create_local_fleet(project, "here", 1)
    assert plan(api, "type: task\nfleets: [elsewhere]\ncommands: [echo]\n")["reasons"] == [
        "the project has no active fleet named elsewhere (the run's `fleets`)"]


def test_busy_or_unreachable_hosts_are_counted_but_not_offered(api, project):
    fleet = create_local_fleet(project, "busy", 2)
    fleet.instances.filter(name="busy-0").update(status="busy")
    fleet.instances.filter(name="busy-1").update(unreachable=True)
    assert plan(api, "type: task\ncommands: [echo]\n")["reasons"] == [
        "default: needs 1 host: fleet busy has 2 hosts, 0 of them idle and reachable now: let it wait for busy "
        "hosts (retry: {on_events: [no-capacity]})"]


def test_a_large_fleet_is_explained_by_its_kinds_of_host_with_every_host_counted(api, project, monkeypatch):
    from instances import fit_reasons

    fleet = create_local_fleet(project, "big", 60)
    gpu = {**fleet.instances.first().resources, "gpus": [{"name": "A100", "memory_gb": 80}] * 2}
    fleet.instances.filter(index__lt=3).update(resources=gpu, gpu_count=2)
    fleet.instances.filter(index=0).update(status="busy")
    tested = []
    real = fit_reasons.fits
    monkeypatch.setattr(fit_reasons, "fits", lambda req, res: tested.append(1) or real(req, res))
    assert plan(api, "type: task\nnodes: 3\nresources: {gpu: A100:2}\ncommands: [echo]\n")["reasons"] == [
        "default: needs 3 hosts with 2 x gpu A100: fleet big has 60 hosts, 3 with 2 x gpu A100, 2 of them idle and "
        "reachable now: lower nodes to 2 or let it wait for busy hosts (retry: {on_events: [no-capacity]})"]
    # three kinds of host (idle with GPUs, busy with GPUs, idle without): the tests run per kind, not per host
    assert len(tested) < 60, len(tested)
