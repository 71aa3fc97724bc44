"""Engine tests start real runner agents and job processes; none may outlive its test.

The root conftest's `_muster_dirs` stops them after every test; the settings a test changes may
point LOCAL_DIR elsewhere, so that directory is swept too.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from engine import messages
from tests.engine.outcome_helpers import Sent
from tests.local_processes import kill_everything_under


@pytest.fixture(autouse=True)
def _no_leftover_processes(settings):
    yield
    kill_everything_under(Path(settings.MUSTER["LOCAL_DIR"]))


@pytest.fixture
def sent(monkeypatch):
    """The engine's messages recorded, not sent (tests/engine/outcome_helpers.Sent)."""
    fake = Sent()
    monkeypatch.setattr(messages, "registered", fake)
    return fake
