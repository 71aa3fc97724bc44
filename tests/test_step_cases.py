"""Every claimed step has its four unit cases (issue 21), each a test marked `step_case(step, case)`.

The cases, run in the test process on a faked runner or backend (tests/engine/test_*_steps.py):
`eligibility` (which rows it takes, and that its messages leave once the row is free), `success`
(what it leaves and sends), `stale` (its lease taken over while it worked: the outcome dropped, the
new holder's row left alone) and `contention` (another worker holds the row: it does nothing).

The steps are found in the code, not listed here, so a new step is held to the rule the day it
appears: the Celery tasks engine/tasks.py makes with `step_task` (acknowledged late), and every
step name the product code hands to `claims.claimed` or `claims.claimed_batch` (the batch
watchers, which beat sends as plain tasks). The cases are read from the marks of the test modules
that use the marker, imported here (a few modules: quicker than a pytest collection in a
subprocess, and the marks are the ones pytest itself reads).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import warnings
from pathlib import Path

import pytest
from celery.exceptions import CDeprecationWarning

ROOT = Path(__file__).resolve().parent.parent
CASES = ("eligibility", "success", "stale", "contention")
CLAIMING = {"claimed", "claimed_batch"}
PRODUCT = ("engine", "runs", "instances", "backends", "console", "dstack_api", "events", "projects", "muster")


def step_tasks() -> set[str]:
    """The engine's tasks made by step_task: the ones redelivered when their worker was lost."""
    from engine import tasks

    with warnings.catch_warnings():  # a task made with priority= says celery 6 will drop it, once per task
        warnings.simplefilter("ignore", CDeprecationWarning)
        return {obj.name.rsplit(".", 1)[-1] for obj in vars(tasks).values()
                if hasattr(obj, "delay") and obj.acks_late and obj.reject_on_worker_lost}


def claimed_names(source: str, where: str = "<source>") -> set[str]:
    """The step names passed (third argument, or `step=`) to claims.claimed / claims.claimed_batch."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if called not in CLAIMING:
            continue
        name = node.args[2] if len(node.args) > 2 else next((k.value for k in node.keywords if k.arg == "step"), None)
        # a computed name could not be matched with its tests' marks
        assert isinstance(name, ast.Constant) and isinstance(name.value, str), \
            f"{where}:{node.lineno}: a claimed step's name must be a string literal"
        names.add(name.value)
    return names


def product_claimed_names() -> set[str]:
    names = set()
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if "/migrations/" in rel or rel == "engine/claims.py":  # claims.py defines them
                continue
            names |= claimed_names(path.read_text(), rel)
    return names


def marked_cases() -> dict[tuple[str, str], list[str]]:
    """(step, case) -> the tests marked so, from every test module that uses the marker."""
    found: dict[tuple[str, str], list[str]] = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        if path == Path(__file__).resolve() or "step_case" not in path.read_text():
            continue
        module = importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts))
        for owner_name, owner in inspect.getmembers(module, inspect.isclass):
            if owner_name.startswith("Test"):
                for name, func in inspect.getmembers(owner, inspect.isfunction):
                    _add(found, f"{path.name}::{owner_name}::{name}", func, owner)
        for name, func in inspect.getmembers(module, inspect.isfunction):
            if func.__module__ == module.__name__:
                _add(found, f"{path.name}::{name}", func)
    return found


def _add(found: dict, where: str, func, owner=None) -> None:
    if not func.__name__.startswith("test"):
        return
    marks = list(getattr(func, "pytestmark", [])) + list(getattr(owner, "pytestmark", []))
    if any(mark.name in ("skip", "skipif", "xfail") for mark in marks):
        return  # a case that does not run does not count
    for mark in marks:
        if mark.name == "step_case":
            found.setdefault(tuple(mark.args), []).append(where)


def missing(steps: set[str], cases: dict[tuple[str, str], list[str]]) -> list[str]:
    """What the rule finds wrong: a step without one of its four cases, a mark that names no step
    or no case (a typo would otherwise leave its step looking covered or not)."""
    wrong = [f"{step}: no {case} case" for step in sorted(steps) for case in CASES if (step, case) not in cases]
    for key, tests in sorted(cases.items()):
        if len(key) != 2 or key[0] not in steps or key[1] not in CASES:
            wrong.append(f"{', '.join(tests)}: step_case{key} names no step and case "
                         f"(steps: {', '.join(sorted(steps))}; cases: {', '.join(CASES)})")
    return wrong


def test_the_check_names_the_step_and_the_case_it_misses_and_marks_that_name_nothing():
    cases = {("a", case): ["t"] for case in CASES} | {("b", "success"): ["t"], ("b", "stale"): ["t"],
                                                      ("c", "success"): ["typo"], ("a", "stal"): ["typo2"]}
    assert missing({"a", "b"}, cases) == [
        "b: no eligibility case", "b: no contention case",
        "typo2: step_case('a', 'stal') names no step and case (steps: a, b; cases: eligibility, success, "
        "stale, contention)",
        "typo: step_case('c', 'success') names no step and case (steps: a, b; cases: eligibility, success, "
        "stale, contention)",
    ]


def test_the_check_finds_the_names_given_to_claimed_and_claimed_batch():
    source = "\n".join([
        "claims.claimed(Job, pk, 'one', body, status='x')",
        "claims.claimed_batch(due, 10, 'two', _watch)",
        "claimed(Job, pk, step='three', body=body)",
        "claims.claim(Job, pk)",  # a bare claim is no step
    ])
    assert claimed_names(source) == {"one", "two", "three"}
    with pytest.raises(AssertionError, match="string literal"):
        claimed_names("claims.claimed(Job, pk, NAME, body)")


def test_every_step_task_claims_its_row_under_its_own_name():
    # the marks name a step once: a task whose step claims under another name would be two steps
    tasks, claimed = step_tasks(), product_claimed_names()
    assert tasks, "no step_task found in engine/tasks.py"
    assert tasks <= claimed, f"step tasks that claim under another name: {sorted(tasks - claimed)}"
    assert claimed - tasks, "the batch watchers (claimed_batch) were not found"


def test_every_claimed_step_has_its_four_unit_cases():
    wrong = missing(step_tasks() | product_claimed_names(), marked_cases())
    assert not wrong, ("each claimed step wants a test marked @pytest.mark.step_case(step, case) for each of "
                       f"{', '.join(CASES)} (tests/engine/test_*_steps.py):\n" + "\n".join(wrong))
