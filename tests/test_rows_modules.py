"""Hand-written SQL lives only in the rows modules: each app's `rows.py`, muster/rows.py (the row
machinery they share), muster/compiled.py (queries compiled once per process) and
engine/locked_claims.py (the claim protocol's statements, written for every claimed model and
so the engine's, beside engine/claims.py that runs the protocol).

Elsewhere a table's statements would drift from each other (the events INSERT was written four
times) and from the models' columns. Hand-written means: a cursor, `.raw(`, `RawSQL`, `.extra(`, or
a string constant that is a statement (SELECT ... FROM, INSERT INTO, UPDATE ... SET, DELETE FROM, a
WITH). Migrations are frozen history and stay out, as do tests and bench/.
"""

from __future__ import annotations

import ast
import re

from tests.test_import_graph import ROOT, product_modules

ROWS_MODULES = {"engine.locked_claims", "muster.compiled"}

_STATEMENT = re.compile(r"^\s*\(?\s*(SELECT\s[\s\S]*\sFROM\s|INSERT\s+INTO\s|UPDATE\s+\S+\s+SET\s|DELETE\s+FROM\s"
                        r"|WITH\s+\w+\s+AS\s*\()")
_CALLS = {"execute": "cursor.execute", "executemany": "cursor.executemany", "cursor": "a cursor",
          "raw": ".raw(", "extra": ".extra("}


def is_rows_module(name: str) -> bool:
    return name.split(".")[-1] == "rows" or name in ROWS_MODULES


def _docstrings(tree) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def hand_written_sql(source: str) -> list[tuple[int, str]]:
    """(line, what) for each spelling of hand-written SQL in `source`."""
    tree = ast.parse(source)
    # a docstring says what a statement does; an f-string's parts are looked at as the whole
    skipped = _docstrings(tree) | {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _CALLS:
            found.append((node.lineno, _CALLS[node.func.attr]))
        elif isinstance(node, (ast.Name, ast.Attribute)) and (getattr(node, "id", None) or getattr(node, "attr", None)) == "RawSQL":
            found.append((node.lineno, "RawSQL"))
        elif isinstance(node, ast.alias) and node.name.split(".")[-1] == "RawSQL":
            found.append((node.lineno, "RawSQL"))
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skipped
              and _STATEMENT.match(node.value)):
            found.append((node.lineno, f"a statement: {node.value[:40]!r}"))
        elif isinstance(node, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) else " x " for v in node.values)
            if _STATEMENT.match(text):
                found.append((node.lineno, f"a statement: {text[:40]!r}"))
    return found


def test_the_check_sees_every_spelling_of_hand_written_sql():
    # the rule must see what it forbids, or the test below would pass on any code
    spellings = {
        "with connection.cursor() as c:\n    pass\n": "a cursor",
        "c.execute(sql, params)\n": "cursor.execute",
        "c.executemany(sql, rows)\n": "cursor.executemany",
        "Job.objects.raw(sql)\n": ".raw(",
        "Job.objects.extra(where=['1 = 1'])\n": ".extra(",
        "from django.db.models.expressions import RawSQL\n": "RawSQL",
        "x = expressions.RawSQL('1', [])\n": "RawSQL",
        "SQL = 'SELECT id FROM runs_run WHERE id = %s'\n": "a statement",
        "def f(t):\n    return f'INSERT INTO {t} (a) VALUES (%s)'\n": "a statement",
        "s = f'UPDATE {table} SET status = %s'\n": "a statement",
        "s = 'DELETE FROM runs_job'\n": "a statement",
        "s = f'WITH moved AS ({update}) SELECT 1'\n": "a statement",
    }
    for source, what in spellings.items():
        found = hand_written_sql(source)
        assert len(found) == 1 and found[0][1].startswith(what), (source, found)
    clean = ('"""One UPDATE and one INSERT INTO events: SELECT ... FROM, in words."""\n'
             "message = f'select a fleet from {names}'\nqs = Job.objects.filter(pk=1).update(status='done')\n")
    assert hand_written_sql(clean) == []
    assert is_rows_module("events.rows") and is_rows_module("engine.locked_claims")
    assert not is_rows_module("events.services") and not is_rows_module("runs.transitions")


def test_hand_written_sql_is_only_in_the_rows_modules():
    found = []
    for name, path in product_modules().items():
        if is_rows_module(name):
            continue
        found += [f"{path.relative_to(ROOT)}:{line}: {what}" for line, what in hand_written_sql(path.read_text())]
    assert not found, "hand-written SQL outside the rows modules (move it to the app's rows.py):\n" + "\n".join(found)
