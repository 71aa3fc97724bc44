from __future__ import annotations

import pytest

from runs.configuration import ip_references, substitute_ips
from runs.configuration.interpolation import reference_problems

GROUPS = [("router", 1), ("prefill", 2)]


def test_references_are_listed_in_order_once_each() -> None:
    text = (
        "a=${{ groups[1].nodes[1].IP_ADDRESS }} b=${{groups[0].nodes[0].IP_ADDRESS}} "
        "c=${{ groups[1].nodes[1].IP_ADDRESS }}"
    )
    assert ip_references(text) == [(1, 1), (0, 0)]


def test_whitespace_inside_the_braces_is_optional() -> None:
    assert ip_references("${{groups[2].nodes[3].IP_ADDRESS}}") == [(2, 3)]
    assert ip_references("${{   groups[ 2 ] . nodes[ 3 ].IP_ADDRESS   }}") == [(2, 3)]


def test_substitution_fills_every_reference() -> None:
    text = "--prefill http://${{ groups[1].nodes[0].IP_ADDRESS }}:8000 --decode http://${{ groups[1].nodes[1].IP_ADDRESS }}"
    assert substitute_ips(text, {(1, 0): "10.0.0.2", (1, 1): "10.0.0.3"}) == (
        "--prefill http://10.0.0.2:8000 --decode http://10.0.0.3"
    )


def test_double_dollar_writes_a_literal_expression() -> None:
    text = "echo $${{ groups[0].nodes[0].IP_ADDRESS }} ${{ groups[0].nodes[0].IP_ADDRESS }}"
    assert ip_references(text) == [(0, 0)]
    assert substitute_ips(text, {(0, 0): "1.2.3.4"}) == "echo ${{ groups[0].nodes[0].IP_ADDRESS }} 1.2.3.4"


def test_shell_variables_and_pid_are_left_alone() -> None:
    text = "echo $$ ${HOME} $MODEL_ID {{ not ours }}"
    assert ip_references(text) == []
    assert substitute_ips(text, {}) == text
    assert reference_problems(text, GROUPS) == []


def test_a_missing_ip_is_an_error_not_a_hole() -> None:
    with pytest.raises(KeyError, match=r"groups\[1\].nodes\[0\]"):
        substitute_ips("${{ groups[1].nodes[0].IP_ADDRESS }}", {(0, 0): "1.2.3.4"})


@pytest.mark.parametrize(
    ("text", "phrase"),
    [
        ("${{ groups[2].nodes[0].IP_ADDRESS }}", "groups[2] does not exist"),
        ("${{ groups[1].nodes[2].IP_ADDRESS }}", "group 1 (prefill) has 2 nodes"),
        ("${{ groups[0].nodes[0].IP }}", "`IP` is not a node attribute"),
        ("${{ groups[0].nodes[0] }}", "cannot read"),
        ("${{ groups[x].nodes[0].IP_ADDRESS }}", "cannot read"),
        ("${{ groups[0].nodes[0].IP_ADDRESS", "not closed"),
        ("${{ env.HOME }}", "not supported"),
        ("${{ }}", "not supported"),
    ],
)
def test_problems_name_what_is_wrong(text: str, phrase: str) -> None:
    problems = reference_problems(text, GROUPS)
    assert len(problems) == 1
    assert phrase in problems[0]


def test_group_references_need_groups() -> None:
    assert "no `groups`" in reference_problems("${{ groups[0].nodes[0].IP_ADDRESS }}", None)[0]


def test_a_group_of_unknown_size_has_its_node_indexes_unchecked() -> None:
    assert reference_problems("${{ groups[0].nodes[7].IP_ADDRESS }}", [("a", None)]) == []
