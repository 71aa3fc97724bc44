"""The stock dstack CLI (0.22.5 from PyPI, in its own venv: `make test-dstack` makes .venv-dstack)
run as a subprocess with its home and config in the test's tmp dir."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DSTACK = ROOT / ".venv-dstack" / "bin" / "dstack"


def _installed() -> None:
    if not DSTACK.exists():
        pytest.fail("the dstack CLI is not installed: run `make test-dstack` (it makes .venv-dstack once)")


def dstack_python() -> Path:
    _installed()
    return DSTACK.parent / "python"


def dstack_runner(tmp_path: Path, url: str, token: str, prefix: tuple[str, ...] = ()):
    _installed()
    home = tmp_path / "dstack-home"
    # the CLI asks PyPI for a newer version once a day: today's check is marked done
    (home / ".cache" / ".dstack" / "cli").mkdir(parents=True, exist_ok=True)
    (home / ".cache" / ".dstack" / "cli" / "last_check").touch()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSTACK_")}
    env.update({"HOME": str(home), "NO_COLOR": "1", "COLUMNS": "200", "TERM": "dumb"})

    def run(*args: str, cwd: Path | None = None, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([*prefix, str(DSTACK), *args], env=env, capture_output=True, text=True, timeout=timeout,
                              cwd=cwd or tmp_path)
        return done

    added = run("project", "add", "--name", "main", "--url", f"{url}/dstack", "--token", token, "-y")
    assert added.returncode == 0, (added.stdout, added.stderr)
    return run
