"""Requests that race each other on a real threaded server: each gets a clean 4xx, never a 500."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pytest
from django.db import connection

from projects.models import Membership, Project
from tests.conftest import token_for

pytestmark = pytest.mark.django_db(transaction=True)

CALLERS = 6


def post(url: str, key: str, body: dict, headers: dict | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers={
        "Authorization": f"Token {key}", "Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            return exc.code, json.loads(raw)
        except ValueError:
            return exc.code, {"raw": raw[:300].decode(errors="replace")}


def at_once(count: int, call) -> list:
    """`call(i)` from `count` threads (i = 0 .. count-1) released together; their results."""
    barrier, results = threading.Barrier(count), [None] * count

    def one(i: int) -> None:
        barrier.wait(30)
        results[i] = call(i)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    return results


@pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite's IMMEDIATE transactions serialize the "
                    "check and the insert, so two creates cannot race there")
def test_concurrent_creates_of_one_project_name_give_one_201_and_400s(live_server, django_user_model):
    keys = [token_for(django_user_model.objects.create_user(f"racer{i}")) for i in range(CALLERS)]
    for attempt in range(10):  # a few rounds: each round is one chance for the race to happen
        name = f"raced-{attempt}"
        results = at_once(CALLERS, lambda i, name=name: post(f"{live_server.url}/api/projects/", keys[i],
                                                             {"name": name}))
        codes = sorted(code for code, _ in results)
        assert codes == [201] + [400] * (CALLERS - 1), results
        for code, body in results:
            if code == 400:
                assert body == {"errors": [{"loc": ["name"], "msg": f"project {name} already exists"}]}
        assert Project.objects.filter(name=name).count() == 1
        assert Membership.objects.filter(project__name=name).count() == 1


def _member_keys(django_user_model, count: int) -> list[str]:
    project, _ = Project.objects.get_or_create(name="main")
    keys = []
    for i in range(count):
        user = django_user_model.objects.create_user(f"submitter{i}")
        Membership.objects.create(project=project, user=user, role="user")
        keys.append(token_for(user))
    return keys


def test_one_idempotency_key_sent_at_once_from_retrying_threads_makes_one_run(live_server, django_user_model):
    from runs.models import Run

    (key,) = _member_keys(django_user_model, 1)
    body = {"configuration": "type: task\ncommands: [echo once]\n"}
    results = at_once(CALLERS, lambda i: post(f"{live_server.url}/api/projects/main/runs/", key, body,
                                            {"Idempotency-Key": "one-submission"}))
    assert {code for code, _ in results} == {201}, results
    assert len({body["name"] for _, body in results}) == 1
    assert Run.objects.count() == 1


@pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite serializes the two creates")
def test_concurrent_submissions_of_one_run_name_give_one_201_and_400s(live_server, django_user_model):
    from runs.models import Run

    keys = _member_keys(django_user_model, CALLERS)
    for attempt in range(5):
        body = {"configuration": f"type: task\nname: same-{attempt}\ncommands: [echo]\n"}
        results = at_once(CALLERS, lambda i, body=body: post(f"{live_server.url}/api/projects/main/runs/", keys[i],
                                                             body))
        codes = sorted(code for code, _ in results)
        assert codes[0] == 201 and all(c in (201, 400) for c in codes), results
        assert all(b["errors"][0]["loc"] == ["name"] for c, b in results if c == 400), results
        assert Run.objects.filter(name=f"same-{attempt}").count() == 1
