"""No product module over 400 lines.

A module that long has stopped holding one job: it is where a newcomer gets
lost and where a fix lands in one copy of a rule and not the other. Split it
by responsibility into modules whose names say what they hold.

Product code is every top-level package of the repository (a directory with
an ``__init__.py``), found here rather than listed so a new package such as
``engine/`` is held to the rule the day it appears; tests, bench/ and
migrations are not product code and stay out, as in test_import_graph.py.

There is no exception: the runner, which reaches each host as one file, is a
package like the others, shipped as a zipapp built from it (runner/shipping.py).
"""

from pathlib import Path

from tests.test_import_graph import PACKAGES

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 400
NOT_PRODUCT = {"tests", "bench"}
SKIPPED_PARTS = {"migrations", "tests", "bench", "__pycache__"}


def product_packages():
    return sorted(
        path.name
        for path in ROOT.iterdir()
        if path.is_dir() and (path / "__init__.py").is_file() and path.name not in NOT_PRODUCT
    )


def line_counts():
    counts = {}
    for package in product_packages():
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if SKIPPED_PARTS & set(rel.parts):
                continue
            with path.open("rb") as f:
                counts[rel.as_posix()] = sum(1 for _ in f)
    return counts


def test_every_package_of_the_import_graph_test_is_walked():
    # The two tests look at the same product code; a package the import-graph
    # test knows and this one misses would escape the limit.
    assert set(PACKAGES) <= set(product_packages())
    assert "runs/models.py" in line_counts()
    assert not any(name.split("/")[0] in NOT_PRODUCT or "/migrations/" in name for name in line_counts())


def test_no_product_module_is_over_the_limit():
    over = {name: n for name, n in line_counts().items() if n > LIMIT}
    assert not over, f"product modules over {LIMIT} lines (split them by responsibility):\n" + "\n".join(
        f"  {name}: {n}" for name, n in sorted(over.items(), key=lambda item: -item[1])
    )
