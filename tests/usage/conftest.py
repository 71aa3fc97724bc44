"""Usage tests run real runner agents and jobs on the local backend; none may outlive its test."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.local_processes import kill_everything_under


@pytest.fixture(autouse=True)
def _no_leftover_processes(settings):
    yield
    kill_everything_under(Path(settings.MUSTER["LOCAL_DIR"]))
