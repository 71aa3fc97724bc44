"""Every claimed step's task has its fault tests (a message duplicated, a message lost): a step added
to engine/tasks.py with `@step_task` and no test that puts tests/engine/faults.py's Faulty on it fails
here. Parsed from the sources, so it needs no worker and no database."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def _step_tasks() -> set[str]:
    tree = ast.parse((ROOT / "engine" / "tasks.py").read_text())
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef) and any(
        isinstance(d, ast.Call) and isinstance(d.func, ast.Name) and d.func.id == "step_task"
        for d in node.decorator_list)}


def _faulted() -> dict[str, list[str]]:
    """Task name -> the test modules that name it, among those that import the fault injection."""
    found: dict[str, list[str]] = {}
    for path in (ROOT / "tests").rglob("test_*.py"):
        tree = ast.parse(path.read_text())
        if not any(isinstance(n, ast.ImportFrom) and n.module == "tests.engine.faults" for n in ast.walk(tree)):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.setdefault(node.value, []).append(str(path.relative_to(ROOT)))
    return found


def test_every_claimed_step_has_fault_injection_tests():
    steps = _step_tasks()
    assert {"provision_job", "delete_fleet", "revoke_attach_keys"} <= steps, "the steps were found"
    faulted = _faulted()
    missing = sorted(step for step in steps if step not in faulted)
    assert not missing, f"steps with no fault injection test (tests/engine/faults.py inject): {missing}"
