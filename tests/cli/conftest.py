from __future__ import annotations

import pytest

from cli import follow as cli_follow
from cli import main as cli
from tests.cli.fake_api import FakeApi, start


@pytest.fixture
def home(tmp_path, monkeypatch):
    """An empty HOME, so ~/.muster/config is the test's and never the developer's."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for name in ("MUSTER_URL", "MUSTER_TOKEN", "MUSTER_PROJECT"):
        monkeypatch.delenv(name, raising=False)
    return home


@pytest.fixture
def api(home, monkeypatch):
    fake = FakeApi()
    server = start(fake)
    monkeypatch.setenv("MUSTER_URL", fake.url)
    monkeypatch.setenv("MUSTER_TOKEN", "test-token")
    monkeypatch.setattr(cli, "POLL_SECONDS", 0.01)
    monkeypatch.setattr(cli_follow, "POLL_SECONDS", 0.01)
    yield fake
    server.shutdown()
    server.server_close()
