"""Where the server keeps the runner's zipapp (runner/shipping.py): built on first use into the data
directory, so a fresh clone, an editable install and the Docker image (whose code is read-only to
the server's user) all have one. The bytes are the same wherever they are built (runner/shipping.py)."""

from __future__ import annotations

import functools
from pathlib import Path

from django.conf import settings

from runner import shipping


@functools.cache
def runner_archive() -> Path:
    """The archive as a file, for the local backend to run."""
    return shipping.build(Path(settings.DATA_DIR) / "runner")


@functools.cache
def runner_archive_bytes() -> bytes:
    """What SSH hosts get: built in memory from the installed package, so a file in the data
    directory (writable by the server's user, unlike the code) can never change what hosts run."""
    return shipping.archive_bytes()
