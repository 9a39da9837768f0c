"""Parsing YAML and JSON text strictly: the one place pedsl turns such text into Python values.

Every YAML pedsl reads (``--set`` / ``-P`` values on the command line, a ``train.yaml``, a run's
``config.yaml``) and every JSON it reads from a file (a ``config.json``, a run's manifest, a
checkpoint's ``state.json``) comes through here, so the same three rules hold everywhere:

- **no aliases** (YAML ``*name``): a few hundred bytes of nested aliases expand to gigabytes
  (an "alias bomb"); a config never needs one, so any alias is refused;
- **no duplicate keys**: ``{a: 1, a: 2}`` is a mistake, not "the last one wins";
- **bounded nesting**: lists or mappings nested deeper than :data:`MAX_DEPTH` are refused
  (a thousand levels would otherwise end in a RecursionError);
  JSON is bounded by its parser.

Failures are :class:`StrictParseError` (a ValueError with the 1-based line where known;
:class:`MalformedText` when the text is not YAML / JSON at all); each
caller turns it into its own stage's one-paragraph diagnostic.
"""

from __future__ import annotations

import json
from typing import Any

import yaml

from pedsl.errors import clip, quoted

MAX_DEPTH = 64  # a config is a few levels deep; params hold scalars


class StrictParseError(ValueError):
    """Text that is not acceptable YAML / JSON for pedsl; ``line`` is 1-based or None."""

    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.line = line


class MalformedText(StrictParseError):
    """Text that is not YAML / JSON at all (as opposed to YAML that breaks one of the rules)."""


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader without aliases, duplicate keys or deep nesting."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):  # noqa: ANN001 - PyYAML's signature
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise StrictParseError(f"YAML aliases (*{clip(str(event.anchor), 40)}) are not accepted: "
                                   "write the value out", event.start_mark.line + 1)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise StrictParseError(f"lists or mappings are nested more than {MAX_DEPTH} levels deep",
                                       mark.line + 1)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):  # noqa: ANN001
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: the base class reports it
                break
            if duplicate:
                raise StrictParseError(f"the key {quoted(key, 80)} appears twice in one mapping",
                                       key_node.start_mark.line + 1)
        return super().construct_mapping(node, deep=deep)


_StrictLoader.add_constructor("tag:yaml.org,2002:map", _StrictLoader.construct_yaml_map)


def load_yaml(text: str) -> Any:
    """The value of YAML ``text``; StrictParseError for an alias, a duplicate key, deep nesting
    or malformed YAML (with its line)."""
    loader = None
    try:
        loader = _StrictLoader(text)  # the reader checks the characters here already
        return loader.get_single_data()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise MalformedText("not valid YAML: " + " ".join(str(getattr(exc, "problem", None) or exc).split()),
                            mark.line + 1 if mark else None) from None
    except RecursionError:  # unreachable within MAX_DEPTH; kept so no input can end in a traceback
        raise StrictParseError(f"nested more than {MAX_DEPTH} levels deep") from None
    finally:
        if loader is not None:
            loader.dispose()


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise StrictParseError(f"the key {quoted(key, 80)} appears twice in one object")
        out[key] = value
    return out


def load_json(text: str | bytes) -> Any:
    """The value of JSON ``text``; StrictParseError for a duplicate key, nesting too deep for
    the parser or malformed JSON."""
    try:
        return json.loads(text, object_pairs_hook=_unique_pairs)
    except StrictParseError:
        raise
    except RecursionError:
        raise StrictParseError("JSON nested too deeply (arrays or objects within each other)") from None
    except ValueError as exc:
        raise MalformedText(f"not valid JSON: {clip(str(exc))}", getattr(exc, "lineno", None)) from None
