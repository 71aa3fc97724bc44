"""The spanning example is what docs/tpu.md quotes, and it parses into a router and a 4-host slice."""

from __future__ import annotations

from pathlib import Path

from runs.configuration import parse_run_configuration
from tests.conftest import EXAMPLES

DOC = Path(__file__).resolve().parents[2] / "docs" / "tpu.md"


def test_the_spanning_example_is_quoted_in_the_docs_and_names_a_fleet_per_group():
    text = (EXAMPLES / "tpu-router-span.yml").read_text()
    assert text.rstrip() in DOC.read_text()

    conf = parse_run_configuration(text)

    assert [(g.name, g.nodes, g.fleets) for g in conf.groups] == [("router", 1, ["routers"]),
                                                                  ("trainer", 4, ["tpu"])]
