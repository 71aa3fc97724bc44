"""The API's JSON parser: DRF's, with a bound on nesting, and no NUL or lone surrogate in any
string (muster/text.py).

json.loads recurses once per level: a body of 100,000 `[` raises RecursionError (a 500), and a
body just under the interpreter's limit parses but leaves no stack for whatever walks it next
(validation, the error formatter). Real configurations are a few levels deep.
"""

from __future__ import annotations

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser as DRFJSONParser

from muster.text import unstorable_at
from runs.configuration import ConfigurationError


def depth_over(value, limit: int) -> bool:
    """Whether `value` nests lists/dicts more than `limit` levels (iterative: no recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


class JSONParser(DRFJSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        limit = int(settings.MUSTER["MAX_JSON_DEPTH"])
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError(f"JSON parse error - nested too deeply (more than {limit} levels)") from None
        if depth_over(data, limit):
            raise ParseError(f"JSON parse error - nested too deeply (more than {limit} levels)")
        found = unstorable_at(data)
        if found is not None:  # a 400 located like any bad input
            raise ConfigurationError([{"loc": found[0], "msg": found[1]}])
        return data
