"""The CLI is a thin HTTP client: its commands load neither Django, Celery nor the server's packages.

Checked in fresh interpreters, since this test process has Django loaded already: once by importing
every module of the `cli` package, once by running the installed `muster` console script for real
commands against the fake server with Python's import trace on.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.cli.fake_api import FakeApi, start

# The server side: the settings package (its __init__ loads the Celery app), the frameworks it
# needs, and the apps. None of them may be imported by a client command.
SERVER = {"django", "celery", "kombu", "rest_framework", "muster", "projects", "runs", "instances",
          "events", "backends", "console"}

IMPORT_EVERY_MODULE = """\
import importlib, pkgutil, sys
import cli, cli.main
for module in pkgutil.iter_modules(cli.__path__):
    if module.name != "__main__":
        importlib.import_module("cli." + module.name)
print(" ".join(sorted({name.partition(".")[0] for name in sys.modules})))
"""


def _clean_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MUSTER_", "DJANGO_", "PYTHON"))}
    env["HOME"] = str(home)
    return env


def test_importing_every_cli_module_loads_no_server_module(tmp_path):
    out = subprocess.run([sys.executable, "-c", IMPORT_EVERY_MODULE], cwd=tmp_path, env=_clean_env(tmp_path),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    loaded = set(out.stdout.split())
    assert "cli" in loaded
    assert loaded & SERVER == set()


def _imported(stderr: str) -> set[str]:
    # -X importtime lines: "import time:  self [us] | cumulative | imported package"
    names = set()
    for line in stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip().partition(".")[0])
    return names


def test_muster_commands_load_no_server_module(tmp_path):
    fake = FakeApi()
    fake.on("GET", "runs/", (200, []))
    server = start(fake)
    home = tmp_path / "home"
    home.mkdir()
    # The console script as installed from pyproject.toml, not a module path the test picks.
    muster = Path(sys.executable).with_name("muster")
    env = _clean_env(home) | {"PYTHONPROFILEIMPORTTIME": "1"}
    try:
        commands = [["--version"], ["config", "--url", fake.url, "--token", "t0"], ["ps", "-a"]]
        for command in commands:
            out = subprocess.run([str(muster), *command], cwd=tmp_path, env=env, capture_output=True,
                                 text=True, timeout=60)
            assert out.returncode == 0, (command, out.stdout, out.stderr)
            imported = _imported(out.stderr)
            assert "argparse" in imported, command  # the trace is on: the check below can see imports
            assert imported & SERVER == set(), command
    finally:
        server.shutdown()
    assert "No runs." in out.stdout  # ps really asked the server, with the config written above
    assert len(fake.calls("GET", "runs/")) == 1
