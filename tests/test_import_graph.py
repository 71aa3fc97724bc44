"""No product module may import another that imports it back.

Circles hide which module is the lower layer and are what kept the engine
tangled (imports inside functions held the last one together), so every
import counts here: top-level, inside functions, and ``from x import y``
where ``y`` is a submodule. Tests, migrations and bench/ are not product
code and stay out of the graph.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("backends", "cli", "console", "dstack_api", "engine", "events", "instances", "muster", "projects", "runner", "runs", "serving")
SKIPPED_PARTS = {"migrations", "tests", "bench", "__pycache__"}


def _module_name(path):
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def product_modules():
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if SKIPPED_PARTS & set(path.relative_to(ROOT).parts):
                continue
            modules[_module_name(path)] = path
    return modules


def _resolve(name, modules):
    # `import a.b.c` binds a, a.b and a.b.c; the deepest product module named
    # is the one whose code runs last, and its parents run too.
    found = []
    parts = name.split(".")
    for end in range(1, len(parts) + 1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            found.append(candidate)
    return found


def imports_of(module, path, modules):
    """(target module, line number, source line) for every product import."""
    is_package = path.name == "__init__.py"
    source = path.read_text()
    lines = source.splitlines()
    edges = []
    for node in ast.walk(ast.parse(source, filename=str(path))):
        targets = []
        if isinstance(node, ast.Import):
            for alias in node.names:
                targets += _resolve(alias.name, modules)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module
            targets += _resolve(prefix, modules)
            for alias in node.names:
                sub = f"{prefix}.{alias.name}"
                if sub in modules:
                    targets.append(sub)
        for target in targets:
            # A package's own __init__ running first is not a dependency edge.
            if target != module and not module.startswith(target + "."):
                edges.append((target, node.lineno, lines[node.lineno - 1].strip()))
    return edges


def strongly_connected(graph):
    """Tarjan's algorithm, iterative so deep chains cannot hit the recursion limit."""
    index, low, on_stack, stack, components = {}, {}, set(), [], []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph[child])))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(sorted(component))
    return components


def import_graph():
    modules = product_modules()
    edges = {name: imports_of(name, path, modules) for name, path in modules.items()}
    return modules, edges


def describe(component, modules, edges):
    inside = set(component)
    out = [f"circle of {len(component)} modules: {', '.join(component)}"]
    for name in component:
        rel = modules[name].relative_to(ROOT)
        for target, lineno, text in sorted(edges[name], key=lambda e: e[1]):
            if target in inside:
                out.append(f"  {rel}:{lineno} -> {target}: {text}")
    return "\n".join(out)


def test_the_graph_sees_every_kind_of_import():
    # The checker itself must see the imports that hid the old circle, or a
    # passing test below would prove nothing.
    modules, edges = import_graph()
    assert "runs.models" in modules and "muster.settings" in modules
    assert not any(name.startswith(("tests", "bench")) or ".migrations" in name for name in modules)
    targets = {name: {t for t, _, _ in found} for name, found in edges.items()}
    assert "muster.celery" in targets["engine.messages"]  # a top-level `from x import y`
    assert "engine.finishing" in targets["engine.groups"]  # an import inside a function
    assert "engine.submitted.provision" in targets["engine.tasks"]  # `from engine.submitted import provision`: a submodule
    fake = {
        "a": ["b"],
        "b": ["c"],
        "c": ["a"],
        "d": ["a"],
        "e": ["e"],
    }
    assert strongly_connected(fake) == [["a", "b", "c"]]


def test_relative_and_function_level_imports_are_edges(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "low.py").write_text("def f():\n    from . import high\n    return high\n")
    (pkg / "high.py").write_text("from pkg.low import f\n")
    modules = {"pkg": pkg / "__init__.py", "pkg.low": pkg / "low.py", "pkg.high": pkg / "high.py"}
    graph = {name: [t for t, _, _ in imports_of(name, path, modules)] for name, path in modules.items()}
    assert "pkg.high" in graph["pkg.low"] and "pkg.low" in graph["pkg.high"]
    assert strongly_connected(graph) == [["pkg.high", "pkg.low"]]


def test_no_import_circles():
    modules, edges = import_graph()
    graph = {name: sorted({t for t, _, _ in found}) for name, found in edges.items()}
    circles = strongly_connected(graph)
    assert not circles, "\n\n".join(describe(c, modules, edges) for c in circles)


# ---- layers ------------------------------------------------------------------------------------
#
# Imports point one way, down this list (docs/how-it-works.md, "Layers"):
#   base      muster/ (settings, the Celery app, crypto, errors), runner/, backends/, and the
#             configuration dialect (runs/configuration/: parsing, no rows): no app code
#   messages  engine/messages.py: the send-only vocabulary ("look at row X"), which names tasks
#             by string and imports no step, so every layer above may send
#   tables    each app's models, choices and transition functions (one per row type, writing its
#             event), and the read-only modules beside them (instances/fitting.py)
#   engine    engine/: the claimed steps, and all host I/O
#   services  each app's services/, api/, admin, signals and apps; console/; dstack_api/; the URLs
#             and the process entry points: validate, write, send a message. Never the engine's
#             steps: a web request that ran one would do host I/O, or engine work, in the request
#   cli       cli/: the HTTP client, which imports no server code at all
BASE, MESSAGES, TABLES, ENGINE, SERVICES, CLI = range(6)
LAYER_NAMES = ("base", "messages", "tables", "engine", "services", "cli")
MAY_IMPORT = {
    BASE: {BASE},
    MESSAGES: {BASE, MESSAGES},
    TABLES: {BASE, MESSAGES, TABLES},
    ENGINE: {BASE, MESSAGES, TABLES, ENGINE},
    SERVICES: {BASE, MESSAGES, TABLES, SERVICES},
    CLI: {BASE, CLI},
}
# `muster serve` is the one command that runs the server: it imports it inside the command
CLI_STARTS = {"muster.serve"}
APPS = ("runs", "instances", "projects", "events", "console", "dstack_api", "serving")
# the parts of an app that sit above the engine
APP_UPPER_PARTS = {"services", "api", "admin", "management", "apps", "signals", "urls", "views", "gateway", "proxy"}
EXACT = {
    "runs.configuration": BASE,
    # the duplicate-key YAML loader the CLI and the dialect share: a leaf that imports only PyYAML,
    # kept under cli/ because the CLI may import nothing of the server's
    "cli.strict_yaml": BASE,
    "engine.messages": MESSAGES,
    # the engine's rules for which job moves nudge their run, called by the transition functions
    "engine.nudges": TABLES,
    # the events table's own write (record, record_many), which every transition function calls
    "events.services": TABLES,
    "console.models": TABLES,
    "dstack_api.models": TABLES,
    "muster.urls": SERVICES,
    "muster.serve": SERVICES,
    "muster.serve_console": SERVICES,
    "muster.demo": SERVICES,
}


def layer_of(module: str) -> int:
    for name, layer in EXACT.items():
        if module == name or module.startswith(name + "."):
            return layer
    parts = module.split(".")
    if parts[0] == "cli":
        return CLI
    if parts[0] == "engine":
        return ENGINE
    if parts[0] in ("console", "dstack_api"):
        return SERVICES
    if parts[0] in APPS:
        return SERVICES if len(parts) > 1 and parts[1] in APP_UPPER_PARTS else TABLES
    return BASE


def backward_imports(modules, edges):
    found = []
    for name, targets in sorted(edges.items()):
        for target, lineno, text in targets:
            if modules[target].name == "__init__.py" and not edges.get(target):
                continue  # `from engine import messages` runs engine/__init__.py, which imports nothing
            if layer_of(name) == CLI and target in CLI_STARTS:
                continue
            if layer_of(target) not in MAY_IMPORT[layer_of(name)]:
                found.append(f"{modules[name].relative_to(ROOT)}:{lineno} ({LAYER_NAMES[layer_of(name)]}) imports "
                             f"{target} ({LAYER_NAMES[layer_of(target)]}): {text}")
    return found


def test_the_layer_rule_sees_a_backward_import():
    # the rule must see what it forbids, or the test below would pass on any code
    assert layer_of("runs.models") == layer_of("instances.transitions") == layer_of("instances.fitting") == TABLES
    assert layer_of("engine.finishing") == ENGINE and layer_of("engine.messages") == MESSAGES
    assert layer_of("runs.services.attach") == layer_of("instances.api.views") == layer_of("console.views") == SERVICES
    assert layer_of("muster.settings") == layer_of("backends.ssh.connection") == layer_of("runner.agent") == BASE
    modules = {name: ROOT / (name.replace(".", "/") + ".py")
               for name in ("engine.finishing", "engine.messages", "runs.services.attach", "runs.models")}
    edges = {"engine.finishing": [("runs.services.attach", 1, "from runs.services import attach")],
             "runs.models": [("engine.finishing", 2, "from engine import finishing")],
             "runs.services.attach": [("engine.messages", 3, "from engine import messages"),
                                      ("runs.models", 4, "from runs.models import Job"),
                                      ("engine.finishing", 5, "from engine import finishing")]}
    found = backward_imports(modules, edges)
    assert len(found) == 3, found
    assert "engine/finishing.py:1 (engine) imports runs.services.attach (services)" in found[0]
    assert "runs/services/attach.py:5 (services) imports engine.finishing (engine)" in found[2]


def test_imports_point_down_the_layers():
    modules, edges = import_graph()
    found = backward_imports(modules, edges)
    assert not found, "imports that point up the layers:\n" + "\n".join(found)
