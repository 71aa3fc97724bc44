"""GET /runs/ of a project with 120 runs, as a client pages through it: a list body per page and
the next page in the Link header, every run once, newest first."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from runs.choices import RunStatus
from runs.models import Run
from tests.api.test_filters import assert_400_naming

pytestmark = pytest.mark.django_db

NEXT = re.compile(r'<([^>]+)>;\s*rel="next"')


def make_runs(project, count: int) -> list[str]:
    Run.objects.bulk_create([Run(project=project, name=f"r{i:03}", configuration={}, status=RunStatus.DONE)
                             for i in range(count)])
    # a few share one submitted_at, as runs of one bulk submission do; the rest are a second apart
    start = timezone.now() - timedelta(hours=1)
    for i, run in enumerate(Run.objects.filter(project=project).order_by("name")):
        Run.objects.filter(pk=run.pk).update(submitted_at=start + timedelta(seconds=max(i, 10)))
    return [r.name for r in Run.objects.filter(project=project).order_by("-submitted_at", "-id")]


def pages(api, url):
    while url:
        response = api.get(url)
        assert response.status_code == 200, response.content
        yield response
        found = NEXT.search(response.headers.get("Link", ""))
        url = found.group(1) if found else None


def test_120_runs_come_in_pages_of_100_with_a_next_link_and_each_run_once(api, project):
    newest_first = make_runs(project, 120)
    got = list(pages(api, "/api/projects/main/runs/"))
    assert [len(p.json()) for p in got] == [100, 20]
    assert [r["name"] for p in got for r in p.json()] == newest_first
    assert "rel=\"next\"" not in got[-1].headers.get("Link", "")


def test_a_client_picks_the_page_size_up_to_the_maximum(api, project):
    newest_first = make_runs(project, 120)
    got = list(pages(api, "/api/projects/main/runs/?limit=7&status=done"))
    assert len(got) == 18 and all(len(p.json()) == 7 for p in got[:-1])
    assert [r["name"] for p in got for r in p.json()] == newest_first
    assert len(api.get("/api/projects/main/runs/?limit=500").json()) == 120
    for bad in ("0", "501", "ten", "-1"):
        assert_400_naming(api.get(f"/api/projects/main/runs/?limit={bad}"), "limit")
    assert_400_naming(api.get("/api/projects/main/runs/?cursor=not-a-cursor"), "cursor")


def test_a_run_submitted_while_paging_does_not_shift_the_pages(api, project):
    newest_first = make_runs(project, 120)
    first = api.get("/api/projects/main/runs/")
    Run.objects.create(project=project, name="late", configuration={}, status=RunStatus.DONE)
    second = api.get(NEXT.search(first.headers["Link"]).group(1))
    assert [r["name"] for r in first.json() + second.json()] == newest_first
