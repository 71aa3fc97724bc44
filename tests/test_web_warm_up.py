"""The web loads what requests need before it serves (muster/warm.py), and loads it in a way that
gunicorn's --preload master can fork: no database connection and no broker connection opened."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PROBE = """
import json, sys
import muster.wsgi
from django.db import connections
from muster.celery import app
print(json.dumps({
    "modules": sorted(m for m in ("engine.tasks", "runs.api.views", "runs.services.submission",
                                  "backends.gcp.compute", "backends.ssh.compute", "backends.local.compute")
                      if m in sys.modules),
    "finalized": app.finalized,
    "db_connections": [a for a in connections if connections[a].connection is not None],
    "broker_pool_made": app._pool is not None,
}))
"""


def test_importing_the_wsgi_app_loads_views_tasks_and_backends_and_opens_no_connection(tmp_path):
    env = {**os.environ, "MUSTER_DATA_DIR": str(tmp_path), "DJANGO_SETTINGS_MODULE": "muster.settings"}
    for key in ("DATABASE_URL", "CELERY_BROKER_URL"):  # the embedded default: nothing to reach
        env.pop(key, None)
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout
    got = json.loads(out.strip().splitlines()[-1])
    assert got["modules"] == sorted(["engine.tasks", "runs.api.views", "runs.services.submission",
                                     "backends.gcp.compute", "backends.ssh.compute", "backends.local.compute"])
    assert got["finalized"] is True
    # a connection made in gunicorn's master would be shared by every forked worker
    assert got["db_connections"] == []
    assert got["broker_pool_made"] is False
