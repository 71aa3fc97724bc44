"""`muster apply` against a live server: warnings shown before asking, `-- ARGS` fill ${{ run.args }}."""

from __future__ import annotations

import io
import sys

import pytest

from cli import main as cli
from runs.models import Run
from tests.conftest import token_for

pytestmark = pytest.mark.django_db(transaction=True)

TASK = """\
type: task
name: train
python: "3.12"
commands:
  - python train.py ${{ run.args }}
resources:
  shm_size: 8GB
"""


@pytest.fixture
def server(live_server, home, make_user, monkeypatch):
    token = token_for(make_user("alice"))
    monkeypatch.setenv("MUSTER_URL", live_server.url)
    monkeypatch.setenv("MUSTER_TOKEN", token)
    return live_server


def test_apply_shows_the_warnings_before_asking_and_sends_the_args(server, tmp_path, monkeypatch, capsys):
    path = tmp_path / "train.yml"
    path.write_text(TASK)
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))  # not a terminal: apply asks, then refuses

    assert cli.main(["apply", "-f", str(path), "--", "--epochs", "3", "--name", "a b"]) == 1

    out = capsys.readouterr().out
    assert "python train.py --epochs 3 --name 'a b'" in out
    assert "python: 3.12 — this server has no default image for Python 3.12" in out
    assert "shm_size: 8GB" in out
    assert not Run.objects.exists()

    assert cli.main(["apply", "-f", str(path), "-y", "--detach", "--", "--epochs", "3"]) == 0
    run = Run.objects.get(name="train")
    assert run.configuration["groups"][0]["commands"] == ["python train.py --epochs 3"]
