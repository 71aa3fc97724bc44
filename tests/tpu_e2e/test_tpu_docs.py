"""docs/tpu.md shows what the code does: the generated shape table and the examples verbatim."""

from __future__ import annotations

from pathlib import Path

from backends.gcp.shape_table import render
from backends.gcp.tpu_shapes import parse_slice
from tests.conftest import EXAMPLES

DOC = Path(__file__).resolve().parents[2] / "docs" / "tpu.md"


def test_the_docs_shape_table_is_the_one_rendered_from_the_shape_table():
    assert render() in DOC.read_text(), "regenerate with `python -m backends.gcp.shape_table`"


def test_the_rendered_table_gives_the_host_counts_of_the_design():
    table = render()
    for name, hosts in [("v2-8", 1), ("v2-32", 4), ("v4-16", 2), ("v5litepod-8", 1), ("v5litepod-16", 4)]:
        assert parse_slice(name).hosts == hosts
        assert f"`{name}` ({hosts})" in table


def test_the_docs_quote_the_tpu_examples_as_they_are():
    text = DOC.read_text()
    for example in ("tpu-fleet.yml", "tpu-v2-32.yml", "tpu-queued-spot-fleet.yml", "tpu-queued-spot-multislice.yml",
                    "tpu-multislice-replace.yml"):
        assert (EXAMPLES / example).read_text().rstrip() in text, example
