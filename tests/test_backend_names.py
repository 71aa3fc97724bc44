"""No file outside backends/ names a backend: the engine, the apps and the API reach a backend only
through the contract (backends/base.py) and the registry (backends/registry.py), so adding one is
a backend module and a registry entry (docs/how-it-works.md, "Adding a backend").

What counts as naming a backend, in any module of the packages below (migrations are history, and
tests and the benchmarks are where backends are exercised by name, so neither is looked at):
- importing a backend's own package: `import backends.gcp.x`, `from backends.ssh.y import z`,
  `from backends import local` (backends.base, .registry and .runner_archive are everyone's);
- a string constant that is a backend's name or dstack's alias of one ("gcp", "ssh", "local",
  "remote"), wherever it stands: a comparison, a default, a dict key, an argument. Words of the
  configuration language that are not backend names (`ssh_config`, `tpu`) are other strings;
- a member of the column's choices by name (`FleetBackend.SSH`): the roles the apps need are the
  registry's (`GIVEN_HOSTS`, `LOCAL_HOSTS`), and `FleetBackend` is only the column's choices.
The few constants that spell the same word without meaning the backend are listed with why.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("cli", "console", "dstack_api", "engine", "events", "instances", "muster", "projects", "runner", "runs")
SHARED = {"base", "registry", "runner_archive"}

# (file, the word): why it is not the backend's name there
NOT_A_BACKEND = {
    ("muster/settings.py", "local"): "the folder local hosts' homes live in (MUSTER_DATA_DIR/local)",
    ("runs/services/attach.py", "ssh"): "the attach answer's key for how to reach the host: the protocol",
    ("cli/attach.py", "ssh"): "the attach answer's key for how to reach the host: the protocol",
    ("cli/ssh.py", "ssh"): "the attach answer's key for how to reach the host: the protocol",
    ("cli/main.py", "ssh"): "the `muster ssh` command's name",
    ("runs/services/shell.py", "ssh"): "the `muster ssh` command's name, in its errors",
}


def backend_words() -> tuple[set[str], set[str]]:
    """The backends' names (and aliases) and their packages under backends/, from the registry."""
    from backends.registry import ALIASES, BACKENDS

    packages = {path.split(".")[1] for path in BACKENDS.values()}
    return {*BACKENDS, *ALIASES}, packages - SHARED


def namings(source: str, names: set[str], packages: set[str]) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, f"import {a.name}") for a in node.names
                      if a.name.split(".")[:2] in (["backends", p] for p in packages)]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            parts = node.module.split(".")
            if parts[0] == "backends" and (len(parts) > 1 and parts[1] in packages
                                           or len(parts) == 1 and any(a.name in packages for a in node.names)):
                found.append((node.lineno, f"from {node.module} import ..."))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
            found.append((node.lineno, repr(node.value)))
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id == "FleetBackend" and node.attr.lower() in names:
            found.append((node.lineno, f"FleetBackend.{node.attr}"))
    return sorted(found)


def test_the_check_sees_every_way_of_naming_a_backend():
    names, packages = backend_words()
    assert {"gcp", "ssh", "local", "remote"} <= names and packages == {"gcp", "ssh", "local"}
    source = "\n".join([
        "if fleet.backend == 'gcp': pass",
        "from backends.ssh.runner_host import SSHRunnerHost",
        "import backends.local.host",
        "from backends import gcp",
        "kind = {'remote': 1}",
        "compute = get_compute(data.get('backend', 'local'))",
        "from backends.registry import compute_class",  # the registry: allowed
        "from backends.base import BackendError",  # the contract: allowed
        "from backends.registry import GIVEN_HOSTS",  # the registry's role names: allowed
        "if inst.backend == FleetBackend.LOCAL: pass",
        "conf.get('ssh_config')",  # a configuration word, not a backend name
        "counts = dict.fromkeys(FleetBackend.values, 0)",  # every backend, none by name
    ])
    assert [line for line, _ in namings(source, names, packages)] == [1, 2, 3, 4, 5, 6, 10]


def test_no_file_outside_backends_names_a_backend():
    names, packages = backend_words()
    found, excused = [], set()
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if "/migrations/" in rel:
                continue
            for line, what in namings(path.read_text(), names, packages):
                word = what.strip("'")
                if (rel, word) in NOT_A_BACKEND:
                    excused.add((rel, word))
                    continue
                found.append(f"{rel}:{line}: {what}")
    assert not found, "reach the backend through backends/registry.py or the contract:\n" + "\n".join(found)
    assert excused == set(NOT_A_BACKEND), "an excuse no longer needed: remove it from NOT_A_BACKEND"
