"""`muster ps` against a live server whose run list comes in pages (GET runs/ with a Link header)."""

from __future__ import annotations

import pytest

from cli import main as cli
from projects.models import Project
from runs.choices import RunStatus
from runs.models import Run
from tests.conftest import token_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def server(live_server, home, make_user, monkeypatch):
    token = token_for(make_user("alice"))
    monkeypatch.setenv("MUSTER_URL", live_server.url)
    monkeypatch.setenv("MUSTER_TOKEN", token)
    return live_server


def test_ps_all_lists_every_run_of_a_project_with_more_than_one_page(server, capsys):
    project = Project.objects.get(name="main")
    Run.objects.bulk_create([Run(project=project, name=f"page-run-{i:03}", configuration={}, status=RunStatus.DONE)
                             for i in range(120)])
    assert cli.main(["ps", "-a"]) == 0
    out = capsys.readouterr().out
    assert sorted(n for n in out.split() if n.startswith("page-run-")) == [f"page-run-{i:03}" for i in range(120)]
