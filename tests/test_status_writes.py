"""A row's status is written in one place: its transition module.

Job and Run move in runs/transitions.py, Fleet, InstanceGroup and Instance in
instances/transitions.py, each move with the event that says why. A status written anywhere else
(`.update(status=...)`, `row.status = ...` then `save()`, a give-back that sets it) is a move
with no event and a guard of its own, which is what left the instance history with holes.
Creating a row in its first status is not a move and is allowed.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("backends", "console", "dstack_api", "engine", "events", "instances", "muster", "projects", "runs", "serving")
TRANSITIONS = {"runs/transitions.py", "instances/transitions.py"}


def status_writes(source: str) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("update", "release", "bulk_update"):
            if any(k.arg == "status" for k in node.keywords) or any(
                    isinstance(a, (ast.List, ast.Tuple)) and any(
                        isinstance(e, ast.Constant) and e.value == "status" for e in a.elts) for a in node.args):
                found.append((node.lineno, f".{node.func.attr}(status=...)"))
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AugAssign, ast.AnnAssign)) else []
        for target in targets:
            for sub in ast.walk(target):
                if isinstance(sub, ast.Attribute) and sub.attr == "status" and isinstance(sub.ctx, ast.Store):
                    found.append((node.lineno, "x.status = ..."))
    return found


def test_the_check_sees_every_way_of_writing_a_status():
    source = "\n".join([
        "Job.objects.filter(pk=1).update(status='done')",
        "claims.release(Fleet, pk, token, status='active')",
        "inst.status = 'idle'",
        "fleet.network, fleet.status = net, 'active'",
        "Instance.objects.bulk_update(rows, ['status', 'updated'])",
        "Job.objects.create(status='submitted')",  # a first status: allowed
        "Job.objects.filter(status='done').update(spec={})",  # a filter on status: allowed
    ])
    assert sorted(line for line, _ in status_writes(source)) == [1, 2, 3, 4, 5]


def test_statuses_are_written_only_by_the_transition_functions():
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if "/migrations/" in rel or rel in TRANSITIONS:
                continue
            found += [f"{rel}:{line}: {what}" for line, what in status_writes(path.read_text())]
    assert not found, "move these through runs/transitions.py or instances/transitions.py:\n" + "\n".join(found)
