"""YAML reading with a bound: :func:`safe_load` is ``yaml.safe_load`` that refuses a document
whose aliases would expand it beyond :data:`MAX_NODES` values (a "billion laughs" alias bomb:
a 1 KB file of nested ``*name`` references standing for hundreds of millions of values, which
validation and error messages would otherwise walk), and recursive aliases.

Counting happens while the document is composed, from the sizes of the anchored nodes, so a
bomb is refused after reading its own few lines, before any value is built. Refusals are
``yaml.MarkedYAMLError`` (line and column of the alias), which callers report with
:func:`problem` as invalid YAML.

Beyond ``yaml.safe_load``: a document nested more than :data:`MAX_DEPTH` levels is refused
(composing is recursive: 20,000 levels would exhaust Python's stack), as is a mapping that
holds one key twice (YAML says keys are unique; PyYAML keeps the last one without a word), and
numbers in exponent notation without a dot (``1e-3``) are numbers, as in YAML 1.2 and JSON
(YAML 1.1, which PyYAML follows, makes them strings).
"""

from __future__ import annotations

import re

import yaml

#: the most values (scalars, lists, mappings) a document may hold with its aliases expanded
MAX_NODES = 1_000_000
#: the deepest a document may nest (lists and mappings in each other)
MAX_DEPTH = 100


class YAMLTooLarge(yaml.MarkedYAMLError):
    """A document over :data:`MAX_NODES`, or an alias to a value that contains itself."""


class BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that counts every value an alias brings in."""

    max_nodes = MAX_NODES

    def __init__(self, stream):
        super().__init__(stream)
        self._nodes = 0
        self._sizes: dict[int, int] = {}
        self._open: list[str] = []  # anchors of the values being composed
        self._depth = 0

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
            raise YAMLTooLarge(
                problem=f"more than {self.max_nodes:,} values with the aliases expanded (an alias bomb?)",
                problem_mark=mark,
            )

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            if event.anchor in self._open:
                raise YAMLTooLarge(
                    problem=f"alias *{event.anchor} refers to a value that contains it",
                    problem_mark=event.start_mark,
                )
            node = self.anchors.get(event.anchor)
            if node is not None:
                self._spend(self._size(node), event.start_mark)
            return super().compose_node(parent, index)
        self._spend(1, event.start_mark)
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            self._open.append(anchor)
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise YAMLTooLarge(
                problem=f"nested more than {MAX_DEPTH} levels deep", problem_mark=event.start_mark
            )
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1
            if anchor is not None:
                self._open.pop()

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            first: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                    continue
                key = self.construct_object(key_node)
                try:
                    seen = first.setdefault(key, key_node)
                except TypeError:  # not hashable: the constructor says so
                    continue
                if seen is not key_node:
                    raise yaml.constructor.ConstructorError(
                        problem=f"duplicate key {key_node.value!r} (first at line "
                        f"{seen.start_mark.line + 1})",
                        problem_mark=key_node.start_mark,
                    )
        return super().construct_mapping(node, deep=deep)


# YAML 1.2's floats: PyYAML's (YAML 1.1) need a dot, so `1e-3` would be the string '1e-3'
BoundedLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                   |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
                   |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
                   |[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*
                   |[-+]?\.(?:inf|Inf|INF)
                   |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def problem(e: yaml.YAMLError) -> str:
    """A YAML error as ``invalid YAML at line L, column C: what``."""
    mark = getattr(e, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    what = getattr(e, "problem", None) or str(e).splitlines()[0]
    return f"invalid YAML{where}: {what}"


def safe_load(stream):
    """``yaml.safe_load`` with the bound of :class:`BoundedLoader`."""
    loader = BoundedLoader(stream)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
