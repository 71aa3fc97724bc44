"""Serializers build their fields once per class (muster/serializers.py) but never share a bound
field: each answer, in any thread, is its own object's."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from runs.api.serializers import JobSerializer, RunListSerializer, RunSerializer
from runs.services.submission import submit_run

pytestmark = pytest.mark.django_db(transaction=True)

TASK = "type: task\nname: {name}\nnodes: {nodes}\ncommands: [echo]\n"


def test_each_serializer_has_its_own_bound_fields_and_a_subclass_its_own_list(project, django_user_model):
    user = django_user_model.objects.get(username="alice")
    small = submit_run(project, user, {"configuration": TASK.format(name="small", nodes=1)})
    large = submit_run(project, user, {"configuration": TASK.format(name="large", nodes=3)})
    one, two = RunSerializer(small), RunSerializer(large)
    assert one.fields["jobs"] is not two.fields["jobs"]
    assert one.fields["jobs"].parent is one and two.fields["jobs"].parent is two
    assert [j["job_num"] for j in one.data["jobs"]] == [0] and [j["job_num"] for j in two.data["jobs"]] == [0, 1, 2]
    assert "configuration" in RunSerializer(small).data
    assert "configuration" not in RunListSerializer(small).data  # the subclass's own fields, not its parent's
    assert set(JobSerializer(large.submitted_jobs[1]).data) == set(JobSerializer.Meta.fields)


def test_runs_serialized_at_once_in_threads_each_get_their_own_answer(project, django_user_model):
    user = django_user_model.objects.get(username="alice")
    runs = [submit_run(project, user, {"configuration": TASK.format(name=f"r{n}", nodes=n + 1)}) for n in range(6)]
    answers: dict[str, dict] = {}
    errors: list[BaseException] = []

    def serialize(run) -> None:
        try:
            for _ in range(50):
                got = RunSerializer(run).data
                assert got["name"] == run.name and len(got["jobs"]) == len(run.submitted_jobs), got["name"]
            answers[run.name] = got
        except BaseException as exc:  # noqa: BLE001 - reported below, with the thread's run
            errors.append(exc)
        finally:
            connection.close()  # this thread's own, if it read anything

    threads = [threading.Thread(target=serialize, args=(run,)) for run in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert {name: len(a["jobs"]) for name, a in answers.items()} == {f"r{n}": n + 1 for n in range(6)}
