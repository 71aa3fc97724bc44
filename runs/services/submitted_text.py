"""The configuration as the user wrote it, kept for the console with its secrets masked.

The stored `configuration` is the validated, normalised model (`index: 0`, `image: null`); people
reading a run want their own text back. It is masked twice: at submit, the values of env entries
that come from a secret or from the request (`_bare_env_keys`) and the request's env values; when
shown, every value of the project's secrets, so a secret typed into the text, or made after the
run, never reaches a page.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import yaml

MASK = "***"
# a run's text is kept up to this size: a configuration past it is cut with a note (the API's
# body limit already bounds it; this keeps one run from holding megabytes of repeated commands)
MAX_CHARS = 256 * 1024


def _entry(key: str) -> re.Pattern:
    # `KEY=value` in a list entry and `KEY: value` in a mapping, block or flow style: the value runs
    # to the end of the line or to the next separator of a flow collection or closing quote, with
    # a quoted value and a `${{ ... }}` reference taken whole (its braces do not end a flow mapping)
    value = r"\"(?:[^\"\n\\]|\\.)*\"|'(?:[^'\n]|'')*'|(?:\$\{\{[^\n}]*\}\}|[^\n,\]}'\"])*"
    return re.compile(rf"(?m)(^|[\s\[{{,'\"-])({re.escape(key)}['\"]?\s*(?:=|:[ \t]))({value})")


def _mask_values(text: str, values: Iterable[str]) -> str:
    # longest first, so a secret that contains another is masked whole
    for value in sorted({v for v in values if v}, key=len, reverse=True):
        text = text.replace(value, MASK)
    return text


def submitted(data: Any, hidden_keys: set[str], request_env: dict[str, str]) -> str:
    """What the run keeps of `configuration` as sent: the text, or YAML of a JSON object."""
    text = data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    text = _mask_values(text, request_env.values())
    for key in sorted(hidden_keys):
        text = _entry(key).sub(lambda m: f"{m.group(1)}{m.group(2)}{MASK}", text)
    if len(text) > MAX_CHARS:
        text = text[:MAX_CHARS] + f"\n# [muster: the text was cut at {MAX_CHARS} characters]\n"
    return text


def shown(run) -> str:
    """The run's text for a page: the project's secret values masked as they are now."""
    return _mask_values(run.submitted_text or "", run.project.secret_values().values())
