"""Every MUSTER key the code reads is declared once in muster/settings.py with its default, and read
one way: `settings.MUSTER["KEY"]`, never `.get("KEY", fallback)` with a second default that can drift
from the first. Parsed from the sources, so a read in code no test runs is held to it too.

The bench's own keys (bench/settings.py) count as declared for bench/ alone; a test's override
(`settings.MUSTER = {**settings.MUSTER, "KEY": ...}`) may only set a declared key.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SKIP = {".venv", "migrations", "node_modules", ".git"}


def _declared(path: Path, name: str = "MUSTER") -> set[str]:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            assert isinstance(node.value, ast.Dict), f"{path}: {name} is not a dict literal"
            return {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
    raise AssertionError(f"{path} declares no {name}")


def _is_muster(node: ast.AST, aliases: set[str]) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "MUSTER") or (
        isinstance(node, ast.Name) and node.id in aliases)


def _problems(path: Path, declared: set[str], root: Path = ROOT) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    # `muster = settings.MUSTER` then `muster["KEY"]`: the local name reads the same dict
    aliases = {t.id for node in ast.walk(tree) if isinstance(node, ast.Assign) and _is_muster(node.value, set())
               for t in node.targets if isinstance(t, ast.Name)}
    where = path.relative_to(root)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and _is_muster(node.value, aliases):
            key = node.slice
            if not isinstance(key, ast.Constant):
                found.append(f"{where}:{node.lineno}: MUSTER[...] with a computed key: name the key")
            elif key.value not in declared:
                found.append(f"{where}:{node.lineno}: MUSTER[{key.value!r}] is not declared in muster/settings.py")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("get", "setdefault") and _is_muster(node.func.value, aliases)):
            found.append(f"{where}:{node.lineno}: MUSTER.{node.func.attr}(...): read MUSTER[KEY], whose "
                         "default is the one in muster/settings.py")
        elif isinstance(node, ast.Dict) and any(k is None and _is_muster(v, aliases)
                                                for k, v in zip(node.keys, node.values, strict=True)):
            found += [f"{where}:{node.lineno}: an override of {k.value!r}, which muster/settings.py does not declare"
                      for k in node.keys if isinstance(k, ast.Constant) and k.value not in declared]
    return found


def _sources() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py") if not SKIP & set(p.relative_to(ROOT).parts))


def test_every_muster_key_read_is_declared_and_read_without_a_fallback():
    product = _declared(ROOT / "muster" / "settings.py")
    bench = product | _declared(ROOT / "bench" / "settings.py")
    problems = []
    for path in _sources():
        if path == ROOT / "bench" / "settings.py":
            continue  # it declares the bench's keys
        problems += _problems(path, bench if path.relative_to(ROOT).parts[0] == "bench" else product)
    assert not problems, "\n".join(problems)


def test_the_source_check_sees_a_fallback_an_undeclared_key_an_alias_and_an_override(tmp_path):
    # the check itself, on code written the ways the tree once read its settings
    bad = tmp_path / "bad.py"
    bad.write_text("from django.conf import settings\n"
                   "a = settings.MUSTER.get('SWEEP_INTERVAL', 2.0)\n"
                   "b = settings.MUSTER['NEVER_DECLARED']\n"
                   "m = settings.MUSTER\n"
                   "c = m.get('SWEEP_INTERVAL', 1)\n"
                   "d = settings.MUSTER['SWEEP_INTERVAL']\n"
                   "settings.MUSTER = {**settings.MUSTER, 'ALSO_NEW': 1, 'SWEEP_INTERVAL': 0.1}\n")
    got = sorted(_problems(bad, {"SWEEP_INTERVAL"}, root=tmp_path))
    assert [g.split(":")[1] for g in got] == ["2", "3", "5", "7"], got
    assert "NEVER_DECLARED" in got[1] and "ALSO_NEW" in got[3]


def _number_constants(path: Path) -> list[str]:
    found = []
    for node in ast.parse(path.read_text()).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        value = getattr(node, "value", None)
        numeric = isinstance(value, ast.Constant) and type(value.value) in (int, float) or (
            isinstance(value, ast.BinOp) and all(isinstance(side, ast.Constant) for side in (value.left, value.right)))
        found += [f"{path.relative_to(ROOT)}:{node.lineno}: {t.id}" for t in targets
                  if numeric and isinstance(t, ast.Name) and t.id.isupper()]
    return found


def test_the_engines_tuning_values_live_in_engine_tuning():
    # a batch size, thread count or delay found in one place, each with its reason; what an operator
    # may change is a MUSTER setting instead
    stray = [c for path in sorted((ROOT / "engine").rglob("*.py")) if path.name != "tuning.py"
             for c in _number_constants(path)]
    assert not stray, "move these to engine/tuning.py (with the reason for each):\n" + "\n".join(stray)
