"""The YAML loader that refuses a key written twice in one mapping, for the CLI and the server alike.

PyYAML silently keeps the last value, which turns a copy-paste slip into a configuration that
quietly does something else. The CLI says so first, naming the file and the line; the server
(runs/configuration/documents.py, with its own additions) refuses the same document the same way.
Only PyYAML here: the CLI imports no server module (tests/cli/test_standalone.py).
"""

from __future__ import annotations

from typing import Any

import yaml


class StrictLoader(yaml.SafeLoader):
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
