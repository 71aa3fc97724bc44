"""Text the database cannot store: PostgreSQL refuses a NUL character (U+0000) in text and jsonb.

A NUL that reached a write was a 500 ("unsupported Unicode escape sequence"), so input is refused
where it is read: the API's JSON parser, the YAML loader and the names in a URL.
"""

from __future__ import annotations

NUL = "\x00"
NUL_MESSAGE = "text cannot hold a NUL character (\\u0000): remove it"


def nul_at(value) -> list | None:
    """The location (keys and indexes) of the first string in `value`, key or value, that holds a
    NUL, else None. Iterative: the value may be as deep as the parser allowed."""
    stack: list[tuple[object, list]] = [(value, [])]
    while stack:
        item, loc = stack.pop()
        if isinstance(item, str):
            if NUL in item:
                return loc
        elif isinstance(item, dict):
            for key, child in item.items():
                # a YAML key may be null, a bool or a float: a location names it as text
                place = key if isinstance(key, str | int) and not isinstance(key, bool) else str(key)
                if isinstance(key, str) and NUL in key:
                    return [*loc, place]
                stack.append((child, [*loc, place]))
        elif isinstance(item, list):
            stack.extend((child, [*loc, i]) for i, child in enumerate(item))
    return None
