"""Where the server keeps the runner's zipapp (runner/shipping.py): built on first use into the data
directory, so a fresh clone, an editable install and the Docker image (whose code is read-only to
the server's user) all have one."""

from __future__ import annotations

import functools
from pathlib import Path

from django.conf import settings

from runner import shipping


@functools.cache
def runner_archive() -> Path:
    return shipping.build(Path(settings.DATA_DIR) / "runner")
