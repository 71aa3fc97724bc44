"""One vocabulary: no bare status strings in product code (issue 14, item 5).

A status, state or reason is named through its enum (runs/choices.py, instances/models.py), so a
reader finds every place a word is used by searching for one name, and a typo is an
AttributeError instead of a branch that is never taken. This test parses the product sources and
fails on a string literal equal to a known status, state or reason value where code decides or
writes one:

- compared: ``x == "running"``, ``x != "failed"``, ``x in ("pending", "provisioning")``;
- passed as a keyword naming a status field: ``status="idle"``, ``status__in=[...]``,
  ``instance__status="busy"``, ``state=``, ``reason=``, ``termination_reason=``,
  ``stop_requested=`` (so ``Q(status=...)``, ``.filter()``, ``.exclude()``, ``.update()`` and
  event records alike);
- assigned to such an attribute: ``instance.termination_reason = "idle"``;
- used as a key of a dict literal (a map keyed by statuses is keyed by the enum members).

The known values are read from the enums themselves, so a status added to an enum is held to the
rule the day it appears. Left out: cli/ (an HTTP client that must not import Django; it reads the
API's documented values), runner/ (stdlib-only, shipped to hosts; RunnerState is made of the
words of runner/protocol.py, see test_the_runner_and_the_server_share_the_runners_states below),
tests, migrations and bench/.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from django.db import models

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("backends", "console", "engine", "events", "instances", "muster", "projects", "runs", "serving")
SKIPPED_PARTS = {"migrations", "tests", "bench", "__pycache__"}
# The modules whose TextChoices hold statuses, states and reasons.
ENUM_MODULES = ("runs.choices", "instances.models", "events.models")
ENUM_NAME = re.compile(r"(Status|State|Reason|Request|Condition)$")
# Keyword and attribute names that hold one of those values (the last field of a lookup).
FIELDS = {"status", "state", "reason", "termination_reason", "stop_requested"}
LOOKUPS = {"in", "exact", "iexact"}
# The other enum-valued fields of the models, checked where code names the field: compared with
# `kind`, `x.backend`, `fleet.placement` or passed as `kind=`, `backend=`, `placement=`.
KIND_FIELDS = {"kind": "GroupKind", "backend": "FleetBackend", "placement": "Placement"}


def vocabulary_enums():
    import importlib

    found = []
    for name in ENUM_MODULES:
        module = importlib.import_module(name)
        for attr, value in vars(module).items():
            if (isinstance(value, type) and issubclass(value, models.TextChoices)
                    and value.__module__ == module.__name__ and ENUM_NAME.search(attr)):
                found.append(value)
    return found


def known_values():
    return {str(value) for enum in vocabulary_enums() for value in enum.values if value}


def kind_values():
    from instances import models as instance_models

    return {field: set(getattr(instance_models, enum).values) for field, enum in KIND_FIELDS.items()}


def product_files():
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if not SKIPPED_PARTS & set(path.relative_to(ROOT).parts):
                yield path


def _literals(node):
    """The string literals a comparison operand or keyword value is made of."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [literal for elt in node.elts for literal in _literals(elt)]
    if isinstance(node, ast.IfExp):  # status="a" if x else "b"
        return _literals(node.body) + _literals(node.orelse)
    if isinstance(node, ast.Starred):
        return _literals(node.value)
    if isinstance(node, ast.BoolOp):  # status=given or "pending"
        return [literal for value in node.values for literal in _literals(value)]
    return []


def _field_of(name):
    parts = [part for part in name.split("__") if part not in LOOKUPS]
    return parts[-1] if parts else ""


def _names_a_status(name):
    return _field_of(name) in FIELDS


def _operand_field(node):
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return ""


def bare_words(path, known, kinds=None):
    """(line, what) for every bare status word in one source file (and, given `kinds`, every bare
    value of a field in KIND_FIELDS where that field is named)."""
    kinds = kinds or {}
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        literals = []
        if isinstance(node, ast.Compare):
            operands = (node.left, *node.comparators)
            for operand in operands:
                literals += _literals(operand)
            for field in {_operand_field(operand) for operand in operands} & set(kinds):
                found += [(lit.lineno, repr(lit.value)) for operand in operands for lit in _literals(operand)
                          if lit.value in kinds[field]]
        elif isinstance(node, ast.Call):
            for keyword in node.keywords:
                if keyword.arg and _names_a_status(keyword.arg):
                    literals += _literals(keyword.value)
                elif keyword.arg and _field_of(keyword.arg) in kinds:
                    found += [(lit.lineno, repr(lit.value)) for lit in _literals(keyword.value)
                              if lit.value in kinds[_field_of(keyword.arg)]]
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Attribute) and t.attr in FIELDS for t in targets) and node.value:
                literals += _literals(node.value)
        elif isinstance(node, ast.Dict):
            literals += [key for key in node.keys if key is not None and _literals(key)]
        for literal in literals:
            if literal.value in known:
                found.append((literal.lineno, repr(literal.value)))
    return found


def test_no_bare_status_words_in_product_code():
    known, kinds = known_values(), kind_values()
    assert {"running", "terminated", "idle", "creating_container_error", "abort"} <= known, known
    problems = []
    for path in product_files():
        # backends/ is the layer below instances.models: it names its own backends (the registry's keys)
        layer_kinds = {} if path.relative_to(ROOT).parts[0] == "backends" else kinds
        for line, word in sorted(set(bare_words(path, known, layer_kinds))):
            problems.append(f"{path.relative_to(ROOT)}:{line}: {word}")
    assert not problems, (
        "bare status words (name them through their enum in runs/choices.py or instances/models.py):\n"
        + "\n".join(problems)
    )


def test_the_check_finds_each_kind_of_bare_word(tmp_path):
    source = tmp_path / "sample.py"
    source.write_text(
        'a = x == "running"\n'
        'b = x.status not in ("pending", "other")\n'
        'Q(status="terminated")\n'
        'Job.objects.filter(run__status__in=["done"])\n'
        'record(p, s, m, status="pulling")\n'
        'inst.termination_reason = "idle"\n'
        'COLOURS = {"failed": "#b00020"}\n'
        'Run.objects.update(stop_requested="abort" if a else "stop")\n'
        'if group.kind == "tpu_pod" or fleet.placement != "cluster": Fleet(placement=c or "any")\n'
        'fine = x == "unrelated" and RunnerState.FAILED == y and d["idle"] and name == "local"\n'
    )
    found = sorted(line for line, _ in bare_words(source, known_values(), kind_values()))
    assert found == [1, 2, 3, 4, 5, 6, 7, 8, 8, 9, 9, 9]


def test_the_runner_and_the_server_share_the_runners_states():
    """The runner's protocol module (stdlib only, shipped to hosts) declares its states; RunnerState
    is made of the same words, and every state the runner writes is one of them."""
    from runner import protocol
    from runs.choices import RUNNER_FINAL, RUNNER_LIVE, RunnerState

    assert set(protocol.STATES) == set(RunnerState.values)
    assert set(protocol.FINAL_STATES) == set(RUNNER_FINAL)
    assert set(protocol.LIVE_STATES) == set(RUNNER_LIVE)
    assert set(protocol.STATES) == set(RUNNER_LIVE) | set(RUNNER_FINAL)
    written = []
    for path in sorted((ROOT / "runner").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Dict):
                for key, value in zip(node.keys, node.values, strict=True):
                    if isinstance(key, ast.Constant) and key.value == "state" and isinstance(value, ast.Constant):
                        written.append((path.name, node.lineno, value.value))
            elif isinstance(node, ast.Compare) and isinstance(node.left, ast.Call) and ast.unparse(
                    node.left).endswith('.get("state")'):
                for comparator in node.comparators:
                    written += [(path.name, node.lineno, literal.value) for literal in _literals(comparator)]
    assert written, "the check reads the runner's state words"
    unknown = [f"runner/{name}:{line}: {state!r}" for name, line, state in written
               if state not in protocol.STATES]
    assert not unknown, "states the runner writes or reads that RunnerState does not know:\n" + "\n".join(unknown)
