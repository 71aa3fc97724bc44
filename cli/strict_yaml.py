"""The YAML loader that refuses a key written twice in one mapping, for the CLI and the server alike.

PyYAML silently keeps the last value, which turns a copy-paste slip into a configuration that
quietly does something else. The CLI says so first, naming the file and the line; the server
(runs/configuration/documents.py, with its own additions) refuses the same document the same way.
Only PyYAML here: the CLI imports no server module (tests/cli/test_standalone.py).
"""

from __future__ import annotations

from typing import Any

import yaml

# PyYAML's safe loader on libyaml's C parser when PyYAML was built with it (its wheels are): 9 to 16
# times faster on run configurations (0.65 -> 0.07 ms for a 4-line task, 3.4 -> 0.2 ms for
# examples/pd-disagg-local.yml), and it refuses a document nested over 1,000 levels with a
# ScannerError where the Python parser recursed until RecursionError. The constructors are the
# same Python ones, so what a document loads as does not change.
_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class StrictLoader(_SafeLoader):
    """SafeLoader that refuses a duplicate key (a subclass may add constructors of its own)."""


def _mapping(loader: StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            duplicate = key in seen
            seen.add(key)
        except TypeError:  # an unhashable key: construct_mapping says what is wrong with it
            continue
        if duplicate:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key `{key}`", key_node.start_mark)
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)
