"""The runner as a package shipped as one zipapp: reproducible, standard library only, runnable
with a bare `python3 <archive>` as the hosts run it."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import uuid
import zipfile
from pathlib import Path

from runner import protocol, shipping

from .runner_helpers import RUNNER_PYTHON, job_spec, kill_everything, wait_state

PACKAGE = Path(shipping.__file__).resolve().parent


def _copy_of_the_package(where: Path) -> Path:
    shutil.copytree(PACKAGE, where, ignore=shutil.ignore_patterns("__pycache__"))
    return where


def test_building_the_zipapp_twice_gives_the_same_bytes(tmp_path):
    first = shipping.build(tmp_path / "a")
    # What another checkout or install changes between two builds: the sources' times and modes.
    copy = _copy_of_the_package(tmp_path / "copy" / "runner")
    for i, path in enumerate(sorted(copy.glob("*.py"))):
        os.utime(path, (1_000_000_000 + i, 1_000_000_000 + 7 * i))
        path.chmod(0o600 if i % 2 else 0o664)
    second = shipping.build(tmp_path / "b", package=copy)
    assert first.read_bytes() == second.read_bytes()
    assert first.name == second.name  # named by its checksum
    assert first.read_bytes() == shipping.archive_bytes()
    with zipfile.ZipFile(first) as archive:
        names = archive.namelist()
        assert names == sorted(names)
        assert {info.date_time for info in archive.infolist()} == {(1980, 1, 1, 0, 0, 0)}
        assert {info.external_attr >> 16 for info in archive.infolist()} == {0o644}
    assert "runner/protocol.py" in names and "__main__.py" in names
    assert "runner/shipping.py" not in names  # the server's, not the host's


def test_a_changed_runner_module_changes_the_archive_and_its_name(tmp_path):
    copy = _copy_of_the_package(tmp_path / "copy" / "runner")
    (copy / "protocol.py").write_text((copy / "protocol.py").read_text() + "\n# changed\n")
    original, changed = shipping.build(tmp_path / "out"), shipping.build(tmp_path / "out", package=copy)
    assert changed != original and changed.read_bytes() != original.read_bytes()
    assert original.read_bytes() == shipping.archive_bytes()  # the older archive stays as it was


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def test_the_runner_package_imports_only_the_standard_library_and_itself():
    outside = {
        f"runner/{path.name}: {name}"
        for path in sorted(PACKAGE.glob("*.py"))
        for name in _imports(path)
        if name not in sys.stdlib_module_names and name not in ("__future__", "runner")
    }
    assert not outside, "the runner runs on hosts with only python3:\n" + "\n".join(sorted(outside))


def test_the_zipapp_runs_a_job_with_a_bare_python_and_nothing_of_the_server(tmp_path):
    """-I: no site-packages, no PYTHONPATH, no current directory: only the archive and the stdlib.
    MUSTER_RUNNER_PYTHON=python3.8 checks the oldest Python the hosts may have."""
    archive = shipping.build(tmp_path / "bin")
    home = tmp_path / "home"
    env = {"PATH": os.environ["PATH"]}

    def call(*args: str, stdin: bytes | None = None) -> dict:
        done = subprocess.run([RUNNER_PYTHON, "-I", str(archive), args[0], "--home", str(home), *args[1:]],
                              input=stdin, capture_output=True, env=env, cwd=tmp_path, timeout=30, check=False)
        assert done.returncode == 0, done.stderr.decode()
        return json.loads(done.stdout)

    try:
        assert call("ensure-agent")["started"] is True
        job = str(uuid.uuid4())
        call("submit", "--job", job, stdin=json.dumps(job_spec(job, ["echo hello"])).encode())
        assert wait_state(home, job, protocol.FINAL_STATES, timeout=20)["state"] == protocol.DONE
        status = call("status")
        assert status["agent_alive"] is True and protocol.status_problem(status) is None
        # The agent and job runner were started from the archive itself (how stop-agent finds them).
        agent = Path(f"/proc/{status['agent']['pid']}/cmdline").read_bytes().split(b"\0")
        assert str(archive).encode() in agent
    finally:
        (home / "agent.stop").touch() if home.is_dir() else None
        kill_everything(home)


def test_the_server_builds_only_specs_the_runner_reads():
    spec = protocol.job_spec(job_id="j", commands=["true"], container={"image": "busybox", "gpus": None})
    assert protocol.validate_spec(spec) == spec
    try:
        protocol.job_spec(commands=["true"], container={"image": "busybox", "mounts": []})
    except TypeError as exc:
        assert "container.mounts" in str(exc)
    else:
        raise AssertionError("an unknown container field must be refused")


def _verbs_sent(path: Path) -> set[str]:
    """First words of the command lines a backend hands to its runner calls."""
    sent = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args
                and node.func.attr in ("_runner", "_runner_json", "_runner_command", "_call")):
            first = node.args[0]
            if isinstance(first, ast.JoinedStr):
                first = first.values[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                sent.add(first.value.split()[0])
    return sent


def test_every_verb_the_server_sends_is_one_the_runner_declares():
    root = PACKAGE.parent
    sent = _verbs_sent(root / "backends" / "ssh" / "runner_host.py") | _verbs_sent(
        root / "backends" / "local" / "runner_host.py")
    assert {"submit", "status", "stop", "log", "cleanup", "ensure-agent"} <= sent, "the check reads the calls"
    assert sent <= set(protocol.COMMANDS), sorted(sent - set(protocol.COMMANDS))
