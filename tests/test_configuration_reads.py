"""The engine reads a run's stored configuration through its typed form, never by string key.

runs/configuration/stored.py turns `Run.configuration` into one frozen object, so a key's name,
type and default for rows that lack it are stated once. A read like `run.configuration["groups"]`
or `conf.get("retry")` in the engine would be a second statement of them (with its own default)
and a shape the typed object no longer guarantees. The check follows the stored dict from where it
is read (`x.configuration`, a `configuration` variable, `run_configuration(...)`) through the names
it is assigned to, the loops over it and the functions that return a part of it, and flags any
subscript or `.get` with a constant string on it.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PASSING_ON = {"list", "dict", "tuple", "sorted", "iter", "reversed", "enumerate"}


def _rooted(node: ast.AST, tainted: set[str], readers: frozenset[str]) -> bool:
    """Whether `node`'s value is (a part of) a run's stored configuration. `readers`: functions
    that return such a part (`group_conf(job)`), found over the whole folder first."""
    if isinstance(node, ast.Attribute):
        return node.attr == "configuration" or _rooted(node.value, tainted, readers)
    if isinstance(node, ast.Name):
        return node.id == "configuration" or node.id in tainted
    if isinstance(node, ast.Subscript):
        return _rooted(node.value, tainted, readers)
    if isinstance(node, ast.Call):
        if isinstance(node.func, ast.Name):
            if node.func.id == "run_configuration" or node.func.id in readers:
                return True
            return node.func.id in PASSING_ON and bool(node.args) and _rooted(node.args[0], tainted, readers)
        if isinstance(node.func, ast.Attribute) and node.func.attr in readers:
            return True  # module.reader(...)
        return isinstance(node.func, ast.Attribute) and _rooted(node.func.value, tainted, readers)
    if isinstance(node, ast.BoolOp):
        return any(_rooted(v, tainted, readers) for v in node.values)
    if isinstance(node, ast.IfExp):
        return _rooted(node.body, tainted, readers) or _rooted(node.orelse, tainted, readers)
    return False


def _scope_nodes(scope: ast.AST):
    """The nodes of one function (its lambdas and comprehensions too), or of the module outside its
    functions: a name bound in one function is not the same name in another."""
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            todo.extend(ast.iter_child_nodes(node))


def _scopes(tree: ast.Module) -> list[ast.AST]:
    return [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))]


def _names(target: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}


def _tainted_names(scope: ast.AST, readers: frozenset[str]) -> set[str]:
    tainted: set[str] = set()
    while True:
        before = len(tainted)
        for node in _scope_nodes(scope):
            if isinstance(node, ast.Assign) and _rooted(node.value, tainted, readers):
                for target in node.targets:
                    tainted |= _names(target)
            elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and node.value is not None \
                    and _rooted(node.value, tainted, readers):
                tainted |= _names(node.target)
            elif isinstance(node, (ast.For, ast.comprehension)) and _rooted(node.iter, tainted, readers):
                tainted |= _names(node.target)
        if len(tainted) == before:
            return tainted


def readers_of(sources: list[str]) -> frozenset[str]:
    """Names of the functions that return a part of the stored configuration, over all `sources`."""
    readers: frozenset[str] = frozenset()
    trees = [ast.parse(s) for s in sources]
    while True:
        found = set(readers)
        for tree in trees:
            for scope in _scopes(tree)[1:]:
                tainted = _tainted_names(scope, readers)
                if any(isinstance(n, ast.Return) and n.value is not None and _rooted(n.value, tainted, readers)
                       for n in _scope_nodes(scope)):
                    found.add(scope.name)
        if found == readers:
            return readers
        readers = frozenset(found)


def _constant_key(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def string_key_reads(source: str, readers: frozenset[str] | None = None) -> list[tuple[int, str]]:
    tree = ast.parse(source)
    readers = readers_of([source]) if readers is None else readers
    found = set()
    for scope in _scopes(tree):
        tainted = _tainted_names(scope, readers)
        for node in _scope_nodes(scope):
            if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and _constant_key(node.slice) \
                    and _rooted(node.value, tainted, readers):
                found.add((node.lineno, f"[{node.slice.value!r}]"))
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                    and node.args and _constant_key(node.args[0]) and _rooted(node.func.value, tainted, readers):
                found.add((node.lineno, f".get({node.args[0].value!r})"))
    return sorted(found)


def test_the_check_sees_every_way_of_reading_a_key():
    source = "\n".join([
        'run.configuration["groups"]',  # 1
        'job.run.configuration.get("retry")',  # 2
        '(job.run.configuration or {}).get("groups")',  # 3
        'def f(job):',
        '    conf = job.run.configuration',
        '    return conf["container"], conf.get("image")',  # 6
        'def g(run, i):',
        '    groups = run.configuration.get("groups") or []',  # 8
        '    name = groups[i]["name"]',  # 9
        '    for group in groups:',
        '        group.get("depends_on")',  # 11
        '    return [d.get("group") for d in groups[i].get("depends_on") or []]',  # 12
        'def h(configuration):',
        '    return configuration.get("startup_order")',  # 14
        'run_configuration(run).profile["backends"]',  # 15
        'run_configuration(run).group(0).env.get("HF_TOKEN")',  # 16
        'def group_conf(job):',
        '    return (job.run.configuration or {}).get("groups")[job.node_group_index]',  # 18
        'group_conf(job).get("probes"), ordering.group_conf(job)["ready_timeout"]',  # 19
        # not the run's configuration, or read by attribute: allowed
        'run_configuration(run).group(0).image',
        'job.spec["resources"], state.get("probes"), fleet_policy(fleet.configuration, backend)',
        'def k(run):',
        '    spec = {"max_duration": run_configuration(run).max_duration}',
        '    return spec["max_duration"]',
    ])
    assert sorted({line for line, _ in string_key_reads(source)}) == [1, 2, 3, 6, 8, 9, 11, 12, 14, 15, 16, 18, 19]


def test_the_engine_reads_the_stored_configuration_by_attribute_only():
    paths = sorted((ROOT / "engine").rglob("*.py"))
    readers = readers_of([p.read_text() for p in paths])
    found = []
    for path in paths:
        rel = path.relative_to(ROOT).as_posix()
        found += [f"{rel}:{line}: {what}" for line, what in string_key_reads(path.read_text(), readers)]
    assert not found, ("read these through runs.configuration.stored.run_configuration(run) (add the key "
                       "there first, docs/how-it-works.md 'Adding a configuration key'):\n" + "\n".join(found))
