"""docs/tpu.md shows what the code does: the generated shape table and the examples verbatim."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from backends.gcp.shape_table import render
from backends.gcp.tpu_shapes import parse_slice
from runs.configuration import parse_any_configuration
from runs.configuration.errors import ConfigurationError
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


def test_the_slice_service_of_the_services_docs_is_a_replica_of_one_job_per_host():
    """docs/services.md's TPU-slice service, as written: 4 jobs per replica; a disagreeing `nodes` is a 400."""
    text = (DOC.parent / "services.md").read_text().split("### TPU-slice replicas", 1)[1]
    document = yaml.safe_load(re.search(r"```yaml\n(.*?)```", text, re.S).group(1))
    (group,) = parse_any_configuration(document).groups
    assert (group.nodes, group.replicas.min) == (4, 2)
    document["groups"][0]["nodes"] = 3
    with pytest.raises(ConfigurationError) as refused:
        parse_any_configuration(document)
    assert {"loc": ["groups", 0, "nodes"], "msg": "v5litepod-16 has 4 hosts: set nodes: 4 or leave nodes out"} \
        in refused.value.errors
