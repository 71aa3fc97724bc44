"""The engine raises its own errors (engine/errors.py): no module of engine/ imports the API's error
types or Django REST framework, whose errors are the answers of a request, not a step's."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
API_MODULES = ("muster.api_errors", "rest_framework")


def api_imports(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        found += [n for n in names if any(n == m or n.startswith(m + ".") for m in API_MODULES)]
    return found


def test_the_check_sees_an_import_of_the_apis_errors():
    assert api_imports("from muster.api_errors import InvalidInput\nimport rest_framework.status\n") == [
        "muster.api_errors", "rest_framework.status"]
    assert api_imports("from engine.errors import Refused\n") == []


def test_no_engine_module_imports_the_apis_errors():
    found = {str(p.relative_to(ROOT)): api_imports(p.read_text()) for p in sorted((ROOT / "engine").rglob("*.py"))}
    assert {path: names for path, names in found.items() if names} == {}
