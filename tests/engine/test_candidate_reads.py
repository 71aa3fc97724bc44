"""The placement reads are written SQL (instances/fitting.py: candidates, fleets_for): they must
answer exactly what their ORM definitions (free_instances, the fleets of a project) say, on every
kind of host, page after page."""

from __future__ import annotations

import itertools

import pytest

from instances.fitting import candidates, fleets_for
from instances.models import Fleet, GroupKind, Instance, InstanceGroup
from instances.rows import free_instances
from projects.models import Project
from runs.configuration import fits

pytestmark = pytest.mark.django_db

REQUIREMENTS = [
    {},
    {"cpu": {"min": 4}},
    {"cpu": {"min": 2}, "memory": {"min": 16}},
    {"gpu": {"count": {"min": 1}}},
    {"gpu": {"count": {"min": 2}, "names": ["A100"]}},
    {"gpu": {"tpu": "v2-8"}},
]


def _hosts(project: Project, fleet: Fleet) -> None:
    pod = InstanceGroup.objects.create(project=project, fleet=fleet, name=f"{fleet.name}-pod", kind=GroupKind.TPU_POD)
    cluster = InstanceGroup.objects.create(project=project, fleet=fleet, name=f"{fleet.name}-cl",
                                           kind=GroupKind.CLUSTER)
    shapes = itertools.product(["idle", "busy", "terminated"], [False, True], [None, pod, cluster],
                               [(2, 8, []), (8, 32, []), (8, 64, ["A100"]), (16, 64, ["A100", "A100"]),
                                (4, 16, ["H100"] * 3)], [""])
    for n, (status, unreachable, group, (cpus, memory, gpus), _) in enumerate(shapes):
        Instance(project=project, fleet=fleet, group=group, name=f"{fleet.name}-h{n}", backend="ssh", status=status,
                 unreachable=unreachable, resources={"cpus": cpus, "memory_gb": memory,
                                                     "gpus": [{"name": g, "memory_gb": 80} for g in gpus]}).save()
    for n in range(3):  # TPU hosts, in and out of the pod
        Instance(project=project, fleet=fleet, group=pod if n else None, name=f"{fleet.name}-t{n}", backend="ssh", status="idle",
                 resources={"cpus": 96, "memory_gb": 300, "tpu": "v2-8"}).save()


def orm_candidates(fleet: Fleet, req: dict, busy_too: bool):
    """What candidates reads, as the ORM says it (the query it was before it was written out)."""
    qs = free_instances(fleet, busy_too).filter(cpus__gte=(req.get("cpu") or {}).get("min") or 0,
                                                memory_gb__gte=(req.get("memory") or {}).get("min") or 0)
    gpu = req.get("gpu")
    if gpu and gpu.get("tpu"):
        qs = qs.exclude(tpu="")
    else:
        qs = qs.filter(tpu="")
        if gpu:
            qs = qs.filter(gpu_count__gte=(gpu.get("count") or {}).get("min") or 0)
    return qs.order_by("gpu_count", "id")


@pytest.mark.parametrize("busy_too", [False, True])
@pytest.mark.parametrize("page", [1, 3, 64])
def test_candidates_are_the_free_instances_that_fit_in_placement_order_whatever_the_page(project, busy_too, page):
    fleet = Fleet.objects.create(project=project, name="f", backend="ssh", placement="cluster")
    other = Fleet.objects.create(project=project, name="other", backend="ssh", placement="cluster")
    _hosts(project, fleet)
    _hosts(project, other)  # the same hosts in another fleet are never offered
    for req in REQUIREMENTS:
        expected = [i.pk for i in orm_candidates(fleet, req, busy_too) if fits(req, i.resources)]
        got = [i.pk for i in candidates(fleet, req, page=page, busy_too=busy_too)]
        assert got == expected, req
        assert expected or req == {"gpu": {"count": {"min": 2}, "names": ["A100"]}} and not busy_too


def test_fleets_for_is_the_projects_active_fleets_in_the_order_asked_and_never_another_projects(project):
    elsewhere = Project.objects.create(name="elsewhere")
    for p in (project, elsewhere):
        for name, backend, status in [("b", "ssh", "active"), ("a", "local", "active"), ("c", "ssh", "terminating"),
                                      ("d", "gcp", "active")]:
            Fleet.objects.create(project=p, name=name, backend=backend, status=status)
    assert [f.name for f in fleets_for(project.pk, [])] == ["b", "a", "d"]  # in the order they were made
    assert [f.name for f in fleets_for(project.pk, [], local=False)] == ["b", "d"]
    assert [f.name for f in fleets_for(project.pk, ["d", "a", "c", "zz"])] == ["d", "a"]
    assert [f.name for f in fleets_for(project.pk, ["d", "a"], local=False)] == ["d"]
    assert all(f.project_id == project.pk for f in fleets_for(project.pk, []))
    assert fleets_for(project.pk, ["x'); DROP TABLE instances_fleet; --"]) == []
    assert Fleet.objects.count() == 8
