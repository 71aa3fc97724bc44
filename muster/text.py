"""Text the database cannot store: PostgreSQL refuses a NUL character (U+0000) in text and jsonb,
and no UTF-8 encoder takes a lone UTF-16 surrogate (U+D800..U+DFFF), which JSON's `\\ud800` makes.

A NUL that reached a write was a 500 ("unsupported Unicode escape sequence"), a surrogate a 500
when the answer was encoded, so input is refused where it is read: the API's JSON parser, the YAML
loader and the names in a URL.
"""

from __future__ import annotations

import re

NUL = "\x00"
NUL_MESSAGE = "text cannot hold a NUL character (\\u0000): remove it"
SURROGATE_MESSAGE = ("text cannot hold a lone UTF-16 surrogate (\\ud800 to \\udfff): write the character "
                     "itself, or both halves of its pair")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _problem(text: str) -> str | None:
    if NUL in text:
        return NUL_MESSAGE
    if _SURROGATE.search(text):
        return SURROGATE_MESSAGE
    return None


def unstorable_at(value) -> tuple[list, str] | None:
    """The location (keys and indexes) of the first string in `value`, key or value, that holds a
    NUL or a lone surrogate, and what is wrong with it; else None. Iterative: the value may be as
    deep as the parser allowed."""
    stack: list[tuple[object, list]] = [(value, [])]
    while stack:
        item, loc = stack.pop()
        if isinstance(item, str):
            if (problem := _problem(item)) is not None:
                return loc, problem
        elif isinstance(item, dict):
            for key, child in item.items():
                # a YAML key may be null, a bool or a float: a location names it as text
                place = key if isinstance(key, str | int) and not isinstance(key, bool) else str(key)
                if isinstance(key, str) and (problem := _problem(key)) is not None:
                    # the key itself cannot be echoed in the location either
                    return [*loc, place.encode("utf-8", "backslashreplace").decode()], problem
                stack.append((child, [*loc, place]))
        elif isinstance(item, list):
            stack.extend((child, [*loc, i]) for i, child in enumerate(item))
    return None

