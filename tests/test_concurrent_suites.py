"""Two test runs at once on one PostgreSQL (two checkouts, or a suite beside a bench's) keep their
databases apart, and neither leaves one behind."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.waiting import patient

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(not os.environ.get("DATABASE_URL", "").startswith("postgres"),
                                reason="SQLite test databases are files named after the process")


def _databases() -> set[str]:
    import dj_database_url
    import psycopg

    db = dj_database_url.parse(os.environ["DATABASE_URL"])
    with psycopg.connect(dbname="postgres", user=db["USER"] or None, host=db["HOST"] or None,
                         port=db["PORT"] or None, password=db["PASSWORD"] or None, connect_timeout=5) as conn:
        return {row[0] for row in conn.execute("SELECT datname FROM pg_database")}


def test_two_runs_at_once_each_keep_their_own_database_and_drop_it_at_the_end(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "MUSTER_TEST_RUN"))}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-s",
           "tests/probes/db_probe.py"]
    runs = []
    for n in range(2):
        runs.append(subprocess.Popen(cmd, cwd=ROOT, env={**env, "MUSTER_DATA_DIR": str(tmp_path / str(n))},
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        time.sleep(2)
    outputs = [p.communicate(timeout=patient(120))[0] for p in runs]
    for p, out in zip(runs, outputs, strict=True):
        assert p.returncode == 0, out[-3000:]
    names = [re.search(r"database: (\S+)", out).group(1) for out in outputs]
    assert names[0] != names[1], names
    assert not set(names) & _databases(), "a run left its test database"
