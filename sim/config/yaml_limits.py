"""YAML read with limits, so that no scenario file can hang or exhaust the loader: on its size, its nesting
and its aliases (a few hundred bytes of nested aliases stand for billions of values: "billion laughs")."""

from __future__ import annotations

from typing import Any

import yaml

MAX_SCENARIO_BYTES = 1 << 20  # a scenario file is a few KB; 1 MiB leaves room and refuses a runaway file
MAX_YAML_DEPTH = 50  # nesting of mappings and lists (a scenario needs 6)
MAX_YAML_ALIASES = 100  # *alias uses in one document
MAX_YAML_NODES = 100_000  # values once every alias is expanded ("billion laughs" stops here)


class _LimitedLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses documents nested too deeply or using too many aliases, before building them:
    the composer recurses once per level (500 levels end in a RecursionError), and aliases let a few hundred
    bytes stand for billions of values."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_YAML_ALIASES:
                mark = self.peek_event().start_mark
                raise yaml.composer.ComposerError(
                    None, None, f"more than {MAX_YAML_ALIASES} aliases (*name); write the values out", mark)
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise yaml.composer.ComposerError(
                    None, None, f"nested more than {MAX_YAML_DEPTH} levels deep", self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        # A key given twice: YAML's loaders keep the last value without a word, so a second `policy:` pasted under
        # a variant ran instead of the first. Keys a merge (`<<: *base`) brings may still be overridden.
        first: dict[Any, Any] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                mark = first.setdefault(key, key_node.start_mark)
            except TypeError:  # an unhashable key: the constructor below says so
                continue
            if mark is not key_node.start_mark:
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key {key!r} is given twice in this mapping (first at line {mark.line + 1}, "
                    f"column {mark.column + 1}; YAML would keep the last without a word)", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def _expanded_size(value: Any, limit: int) -> int:
    """Values in ``value`` counting every alias expansion (shared objects counted each time they appear),
    computed once per distinct object; stops counting past ``limit``."""
    memo: dict[int, int] = {}

    def size(v: Any) -> int:
        if not isinstance(v, (dict, list)):
            return 1
        key = id(v)
        if key not in memo:
            memo[key] = limit + 1  # a cycle (an alias inside its own anchor) counts as too large
            items = list(v.keys()) + list(v.values()) if isinstance(v, dict) else v
            total = 1
            for item in items:
                total += size(item)
                if total > limit:
                    break
            memo[key] = total
        return memo[key]

    return size(value)


def unshared(value: Any) -> Any:
    """A copy in which no two keys share a dict or list (deepcopy would keep the sharing aliases create)."""
    if isinstance(value, dict):
        return {k: unshared(v) for k, v in value.items()}
    if isinstance(value, list):
        return [unshared(v) for v in value]
    return value


def safe_load_limited(text: str) -> Any:
    """``yaml.safe_load`` with limits on nesting, aliases and expanded size. Raises yaml.YAMLError."""
    loader = _LimitedLoader(text)
    try:
        value = loader.get_single_data()
    finally:
        loader.dispose()
    if _expanded_size(value, MAX_YAML_NODES) > MAX_YAML_NODES:
        raise yaml.YAMLError(f"more than {MAX_YAML_NODES} values once aliases are expanded")
    return value
