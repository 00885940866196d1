"""Where a key path is in a YAML file: found on demand from the parsed node tree, only when a
diagnostic asks for its line."""

from __future__ import annotations

import re
from dataclasses import dataclass

from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

Key = str | int
"""A step of a key path: a mapping key or a list index."""

_PATH_TOKEN = re.compile(r"\[(\d+)\]|([^.\[\]]+)")


def split_path(path: str) -> list[Key]:
    """``ops[3].args.in_features`` (or ``ops.3.args``) -> ``["ops", 3, "args", "in_features"]``."""
    return [int(index) if index else key for index, key in _PATH_TOKEN.findall(path)]


@dataclass(frozen=True)
class LineMap:
    """Lines of the key paths of one file, found on demand from the parsed node tree."""

    root: Node | None = None
    prefix: str = ""
    """The key path the file's root stands for (``model``), or "" for a top-level config."""

    def line(self, path: str) -> int | None:
        """The 1-based line of ``path``, or of the nearest enclosing key the file names; None when
        ``path`` lies outside this file."""
        if self.root is None:
            return None
        if self.prefix:
            if path != self.prefix and not path.startswith((self.prefix + ".", self.prefix + "[")):
                return None
            path = path[len(self.prefix) :]
        node, line = self.root, self.root.start_mark.line + 1
        matched = 0
        for key in split_path(path):
            found = _child(node, key)
            if found is None:
                break
            key_node, node = found
            line = (key_node or node).start_mark.line + 1
            matched += 1
        if not self.prefix and matched == 0:
            return None  # a top-level config file that does not mention this key at all
        return line

    def __contains__(self, path: str) -> bool:
        return self.line(path) is not None


def _child(node: Node, key: Key) -> tuple[Node | None, Node] | None:
    if isinstance(node, MappingNode):
        name = str(key)
        for key_node, value in reversed(node.value):  # the last of duplicate keys is the one kept
            if isinstance(key_node, ScalarNode) and key_node.value == name:
                return key_node, value
        return None
    if isinstance(node, SequenceNode):
        index = key if isinstance(key, int) else int(key) if str(key).isdigit() else -1
        if 0 <= index < len(node.value):
            return None, node.value[index]
    return None


__all__ = ["Key", "LineMap", "split_path"]
