"""A row's lease is read and written only by the claim protocol.

`lease_until` and `lease_token` are named in muster/claimable.py (the columns, the guard of a write
that holds only while a token holds the row, the fields a give-back writes), engine/claims.py (the
claim, the renewals, the give-back) and engine/locked_claims.py (the protocol's own statements)
and nowhere else: a step body or a transition function that wrote the lease itself could free a
row its step still works on, or keep one nobody holds. A transition function takes the step's
lease (`lease=`, muster.claimable.Lease) and the guard and the release come with it.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("backends", "cli", "console", "dstack_api", "engine", "events", "instances", "muster", "projects",
            "runner", "runs")
PROTOCOL = {"engine/claims.py", "engine/locked_claims.py", "muster/claimable.py"}
COLUMNS = ("lease_until", "lease_token")


def _names_a_column(text: str) -> bool:
    return any(text == c or text.startswith(c + "__") for c in COLUMNS)


def lease_uses(source: str) -> list[tuple[int, str]]:
    tree = ast.parse(source)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg and _names_a_column(node.arg):
            found.append((node.value.lineno, f"{node.arg}=..."))
        elif isinstance(node, ast.Attribute) and node.attr in COLUMNS:
            found.append((node.lineno, f".{node.attr}"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings \
                and _names_a_column(node.value):
            found.append((node.lineno, repr(node.value)))
    return sorted(found)


def lease_updates(source: str) -> list[int]:
    """The `.update(` calls that write a lease column by name."""
    return sorted(node.lineno for node in ast.walk(ast.parse(source))
                  if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "update"
                  and any(k.arg in COLUMNS for k in node.keywords))


def _product_files():
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if "/migrations/" not in rel:
                yield rel, path.read_text()


def test_the_check_sees_every_way_of_naming_a_lease_column():
    source = "\n".join([
        '"""lease_token in a docstring is prose."""',
        "Job.objects.filter(pk=1).update(lease_until=None, lease_token='')",  # 2
        "Job.objects.filter(pk=1, lease_token=token).update(spec={})",  # 3
        "rows.filter(lease_until__lt=now)",  # 4
        "guard = {'lease_token': token}",  # 5
        "rows.values_list('pk', 'lease_token')",  # 6
        "if job.lease_until is None: pass",  # 7
        "Job.objects.filter(pk=1, **lease.guard()).update(status='x', **lease.written())",  # the spelling: allowed
        "# lease_token in a comment",
        "x = 'lease_tokens are short'",  # another word
    ])
    assert [line for line, _ in lease_uses(source)] == [2, 2, 3, 4, 5, 6, 7]
    assert lease_updates(source) == [2]


def test_no_update_of_a_lease_column_outside_the_claims():
    found = [f"{rel}:{line}" for rel, source in _product_files() if rel != "engine/claims.py"
             for line in lease_updates(source)]
    assert not found, "a lease is written by engine/claims.py only:\n" + "\n".join(found)


def test_the_lease_columns_are_named_only_by_the_claim_protocol():
    found = [f"{rel}:{line}: {what}" for rel, source in _product_files() if rel not in PROTOCOL
             for line, what in lease_uses(source)]
    assert not found, ("take the lease through muster/claimable.py (Lease, lease_guard, leased, released) or "
                       "engine/claims.py (Held.rows, Held.lease):\n" + "\n".join(found))
