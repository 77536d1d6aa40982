"""YAML reading with a bound: :func:`safe_load` is ``yaml.safe_load`` that refuses a document
whose aliases would expand it beyond :data:`MAX_NODES` values (a "billion laughs" alias bomb:
a 1 KB file of nested ``*name`` references standing for hundreds of millions of values, which
validation and error messages would otherwise walk), and recursive aliases.

Counting happens while the document is composed, from the sizes of the anchored nodes, so a
bomb is refused after reading its own few lines, before any value is built. Refusals are
``yaml.MarkedYAMLError`` (line and column of the alias), which callers already report as
invalid YAML.
"""
from __future__ import annotations

import yaml

#: the most values (scalars, lists, mappings) a document may hold with its aliases expanded
MAX_NODES = 1_000_000


class YAMLTooLarge(yaml.MarkedYAMLError):
    """A document over :data:`MAX_NODES`, or an alias to a value that contains itself."""


class BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that counts every value an alias brings in."""

    max_nodes = MAX_NODES

    def __init__(self, stream):
        super().__init__(stream)
        self._nodes = 0
        self._sizes: dict[int, int] = {}
        self._open: list[str] = []      # anchors of the values being composed

    def _size(self, node) -> int:
        size = self._sizes.get(id(node))
        if size is None:
            if isinstance(node, yaml.SequenceNode):
                size = 1 + sum(self._size(n) for n in node.value)
            elif isinstance(node, yaml.MappingNode):
                size = 1 + sum(self._size(k) + self._size(v) for k, v in node.value)
            else:
                size = 1
            self._sizes[id(node)] = size
        return size

    def _spend(self, n: int, mark) -> None:
        self._nodes += n
        if self._nodes > self.max_nodes:
            raise YAMLTooLarge(problem=f"more than {self.max_nodes:,} values with the aliases "
                               "expanded (an alias bomb?)", problem_mark=mark)

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            if event.anchor in self._open:
                raise YAMLTooLarge(problem=f"alias *{event.anchor} refers to a value that "
                                   "contains it", problem_mark=event.start_mark)
            node = self.anchors.get(event.anchor)
            if node is not None:
                self._spend(self._size(node), event.start_mark)
            return super().compose_node(parent, index)
        self._spend(1, event.start_mark)
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            self._open.append(anchor)
        try:
            return super().compose_node(parent, index)
        finally:
            if anchor is not None:
                self._open.pop()


def safe_load(stream):
    """``yaml.safe_load`` with the bound of :class:`BoundedLoader`."""
    loader = BoundedLoader(stream)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
