"""Reading a YAML document as composed nodes, so that every error names its file and line:
``hosts.yaml:41: groups.pair.hosts[1]: unknown host 'gpu3' (did you mean 'gpu2'?)``.

The hosts.yaml parser (``inventory_parser``) and its ``groups:`` part (``groups_parser``)
both read through one :class:`NodeReader`.
"""

from __future__ import annotations

from typing import Any

import yaml

from ..common.errors import ConfigError
from .hostconfig import did_you_mean


class NodeReader:
    """One document's text and file name, and typed readers of its nodes that raise one-line
    ``ConfigError``s (``FILE:LINE: where: what``)."""

    def __init__(self, text: str, filename: str):
        self.text = text
        self.filename = filename
        self.loader: yaml.SafeLoader | None = None

    # -- errors ------------------------------------------------------------
    def err(self, node: yaml.Node | None, where: str, msg: str) -> ConfigError:
        line = f":{node.start_mark.line + 1}" if node is not None else ""
        prefix = f"{self.filename}{line}: "
        return ConfigError(f"{prefix}{where}: {msg}" if where else f"{prefix}{msg}")

    def src(self, node: yaml.Node) -> str:
        return f"{self.filename}:{node.start_mark.line + 1}"

    # -- yaml nodes ----------------------------------------------------------
    def compose(self) -> yaml.Node | None:
        self.loader = yaml.SafeLoader(self.text)
        try:
            return self.loader.get_single_node()
        except yaml.MarkedYAMLError as e:
            mark = e.problem_mark or e.context_mark
            line = f":{mark.line + 1}" if mark else ""
            what = " ".join(x for x in (e.context, e.problem) if x)
            raise ConfigError(f"{self.filename}{line}: YAML syntax error: {what} "
                              f"(fix the YAML at that line)") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"{self.filename}: YAML syntax error: {str(e).splitlines()[0]}") from None

    def scalar(self, node: yaml.Node) -> Any:
        assert self.loader is not None
        try:
            return self.loader.construct_object(node, deep=True)
        except (yaml.YAMLError, ValueError, TypeError) as e:  # `!tag x`, `2001-02-30`, ...
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise self.err(node, "", f"cannot read this value: {first} (quote it as a string)") from None

    def mapping(self, node: yaml.Node, where: str, allowed: tuple[str, ...] | None) -> dict[str, tuple[yaml.Node, yaml.Node]]:
        """A mapping node as {key: (key_node, value_node)}, rejecting duplicates and unknown keys."""
        if not isinstance(node, yaml.MappingNode):
            raise self.err(node, where, f"expected a mapping, got {self.describe(node)}")
        assert self.loader is not None
        self.loader.flatten_mapping(node)  # YAML merge keys (<<)
        out: dict[str, tuple[yaml.Node, yaml.Node]] = {}
        for knode, vnode in node.value:
            key = self.scalar(knode) if isinstance(knode, yaml.ScalarNode) else None
            if not isinstance(key, str) or not key:
                raise self.err(knode, where or "(top level)",
                               f"keys must be non-empty strings, got {self.describe(knode)}")
            path = f"{where}.{key}" if where else key
            if key in out:
                first = out[key][0].start_mark.line + 1
                raise self.err(knode, path, f"duplicate key (first defined at line {first}; remove one)")
            if allowed is not None and key not in allowed:
                raise self.err(knode, path, f"unknown key{did_you_mean(key, allowed)}; "
                                            f"valid keys: {', '.join(allowed)}")
            out[key] = (knode, vnode)
        return out

    def describe(self, node: yaml.Node) -> str:
        if isinstance(node, yaml.MappingNode):
            return "a mapping"
        if isinstance(node, yaml.SequenceNode):
            return "a list"
        return repr(self.scalar(node))

    def string(self, node: yaml.Node, where: str, *, empty_ok: bool = False) -> str:
        v = self.scalar(node) if isinstance(node, yaml.ScalarNode) else None
        if isinstance(node, yaml.ScalarNode) and isinstance(v, (int, float)) and not isinstance(v, bool) \
                and where.endswith((".host", ".user", ".profile")):
            v = str(node.value)  # a bare number is a fine host/user/profile name
        if not isinstance(v, str):
            raise self.err(node, where, f"expected a string, got {self.describe(node)}")
        if not v and not empty_ok:
            raise self.err(node, where, "must not be empty")
        return v

    def integer(self, node: yaml.Node, where: str, *, lo: int | None = None, hi: int | None = None) -> int:
        v = self.scalar(node) if isinstance(node, yaml.ScalarNode) else None
        if not isinstance(v, int) or isinstance(v, bool):
            raise self.err(node, where, f"expected an integer, got {self.describe(node)}")
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            rng = f"between {lo} and {hi}" if hi is not None else f">= {lo}"
            raise self.err(node, where, f"expected an integer {rng}, got {v}")
        return v

    def number(self, node: yaml.Node, where: str) -> float:
        v = self.scalar(node) if isinstance(node, yaml.ScalarNode) else None
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0:
            raise self.err(node, where, f"expected a positive number of seconds, got {self.describe(node)}")
        return float(v)

    def string_list(self, node: yaml.Node, where: str) -> tuple[str, ...]:
        if isinstance(node, yaml.ScalarNode) and isinstance(self.scalar(node), str):
            return (self.string(node, where),)
        if not isinstance(node, yaml.SequenceNode):
            raise self.err(node, where, f"expected a list of strings, got {self.describe(node)}")
        return tuple(self.string(item, f"{where}[{i}]") for i, item in enumerate(node.value))
