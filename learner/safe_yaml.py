"""YAML for configs that may come from untrusted users: no anchors or aliases, bounded size.

``yaml.safe_load`` builds only plain types, but aliases still let a few hundred bytes name
billions of nodes (7 levels of 9 aliases: 9**7 leaves), and every later walk of the result
(validation, merging, copying) pays for all of them. Configs never need aliases, so the
composer refuses the first anchor or alias it meets, before anything is expanded, and a
node cap bounds what plain text can build. One loader for the CLI, the forms and the API.

Speed: with libyaml (PyYAML's C extension) the text is checked on its event stream (anchors,
aliases, node count, depth: the C scanner and parser, one Python step per event, stopping at the
first refusal) and then built by ``CSafeLoader``; the pure-Python loader is the fallback. A
40 KB config of many small values took ~0.7 s of CPU with the pure-Python loader, ~0.05 s so
(docs/results.md, "Config parsing cost").
"""

from __future__ import annotations

import re
from typing import Any

import yaml

MAX_YAML_CHARS = 100_000
MAX_YAML_NODES = 20_000  # a full RunConfig is ~100 nodes
MAX_YAML_DEPTH = 32  # a RunConfig nests 3 levels; the same bound as the JSON API's
_BRACKETS = re.compile(r"[\[\]{}]")


class UnsafeYamlError(ValueError):
    """Text refused before it was built; ``str()`` says why and where."""


class _Refused(yaml.composer.ComposerError):
    """Valid YAML that a config may not use."""


def _where(err: yaml.MarkedYAMLError) -> str:
    mark = err.problem_mark
    return f"line {mark.line + 1}, column {mark.column + 1}" if mark else "somewhere"


class _BoundedLoader(yaml.SafeLoader):
    max_nodes = MAX_YAML_NODES

    def __init__(self, stream):
        super().__init__(stream)
        self._nodes = self._depth = 0

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            raise _Refused(
                None, None, "anchors and aliases (&name, *name) are not allowed", event.start_mark)
        self._nodes += 1
        if self._nodes > self.max_nodes:
            raise _Refused(
                None, None, f"more than {self.max_nodes} values", event.start_mark)
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise _Refused(None, None, f"nested deeper than {MAX_YAML_DEPTH} levels", event.start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


_C_LOADER = getattr(yaml, "CSafeLoader", None)
_NODE_EVENTS = (yaml.ScalarEvent, yaml.SequenceStartEvent, yaml.MappingStartEvent)
_OPEN_EVENTS = (yaml.SequenceStartEvent, yaml.MappingStartEvent)
_CLOSE_EVENTS = (yaml.SequenceEndEvent, yaml.MappingEndEvent)


def _check_events(text: str, max_nodes: int = MAX_YAML_NODES) -> None:
    """The refusals of ``_BoundedLoader``, on libyaml's event stream: raises _Refused at the
    first anchor or alias, past ``max_nodes`` values or ``MAX_YAML_DEPTH`` levels."""
    nodes = depth = 0
    for event in yaml.parse(text, Loader=_C_LOADER):
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            raise _Refused(None, None, "anchors and aliases (&name, *name) are not allowed", event.start_mark)
        if isinstance(event, _NODE_EVENTS):
            nodes += 1
            if nodes > max_nodes:
                raise _Refused(None, None, f"more than {max_nodes} values", event.start_mark)
            if isinstance(event, _OPEN_EVENTS):
                depth += 1
                if depth > MAX_YAML_DEPTH:
                    raise _Refused(None, None, f"nested deeper than {MAX_YAML_DEPTH} levels", event.start_mark)
        elif isinstance(event, _CLOSE_EVENTS):
            depth -= 1


def _parse(text: str, max_nodes: int) -> Any:
    if _C_LOADER is None:
        loader = type("_Loader", (_BoundedLoader,), {"max_nodes": max_nodes})
        return yaml.load(text, Loader=loader)  # noqa: S506 (a SafeLoader subclass)
    _check_events(text, max_nodes)
    return yaml.load(text, Loader=_C_LOADER)  # noqa: S506 (libyaml's SafeLoader)


def _flow_depth(text: str) -> int:
    """How deeply brackets nest in ``text`` (an upper bound of its flow nesting: brackets in
    quoted strings count too); one regex pass, before the scanner's quadratic cost of deep flow
    collections is paid."""
    depth = deepest = 0
    for bracket in _BRACKETS.findall(text):
        depth = depth + 1 if bracket in "[{" else max(depth - 1, 0)
        deepest = max(deepest, depth)
    return deepest


def load_yaml(text: str, max_chars: int = MAX_YAML_CHARS, max_nodes: int = MAX_YAML_NODES) -> Any:
    """Parse ``text`` safely; raises UnsafeYamlError naming the reason and line/column. Text over
    ``max_chars`` is refused before anything reads it, text of more than ``max_nodes`` values
    (or nested deeper than MAX_YAML_DEPTH) at the first value over, before anything is built."""
    if len(text) > max_chars:
        raise UnsafeYamlError(f"longer than {max_chars} characters")
    if _flow_depth(text) > MAX_YAML_DEPTH:
        raise UnsafeYamlError(f"nested deeper than {MAX_YAML_DEPTH} levels")
    try:
        return _parse(text, max_nodes)
    except _Refused as err:
        raise UnsafeYamlError(f"refused at {_where(err)}: {err.problem}") from None
    except RecursionError:
        raise UnsafeYamlError("nested too deeply") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise UnsafeYamlError(f"not valid YAML{where}: {problem}") from None
    except Exception as err:  # noqa: BLE001 (whatever the text makes the constructors raise is the text's fault)
        # a value the constructors cannot build: an integer over Python's 4300-digit limit,
        # a malformed explicit !!timestamp, a date out of range
        first = (str(err).splitlines() or [type(err).__name__])[0][:200]
        raise UnsafeYamlError(f"a value cannot be read: {first}") from None
