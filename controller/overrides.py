"""Per-launch overrides and sweeps: a few dotted config fields set for one launch
(``train.lr=3e-4``), validated as the config is, and one field swept over a list of values.

The syntax is checked here; whether a value fits a field (type, range, rules across fields,
the model roots, the user's quota) is learner.config's answer on the merged config, given at
launch (controller/config_merge.py, ``run_config``), so both say it the same way.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from learner.safe_yaml import UnsafeYamlError, load_yaml

MAX_OVERRIDES = 8
MAX_VALUE_CHARS = 200
MAX_SWEEP_VALUES = 4  # a few values; with schedules and repeats at most compare.MAX_LAUNCHED runs
PATH = re.compile(r"^[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)+$")
# Top-level fields an override or a sweep may set by their bare name (every other field lives in
# a section: train.lr). The seed is an axis of every RL result: swept, or varied by a comparison's
# repeats (controller/supervision/launching.py).
TOP_LEVEL = ("seed",)
# Fields a launch sets through its own inputs, not through an override.
OWN_FIELDS = {"train.schedule": "the schedule sets it: pick another schedule",
              "train.steps": "use the steps field", "name": "use the name field"}


class OverrideError(ValueError):
    """A bad override or sweep: the message starts with the field it is about."""


def parse_value(text: str, path: str) -> Any:
    """An override's value as typed: an int, a float (3e-4 too, which YAML 1.1 reads as text),
    true/false/null, a [list], or text."""
    text = text.strip()
    if len(text) > MAX_VALUE_CHARS:
        raise OverrideError(f"{path}: the value is longer than {MAX_VALUE_CHARS} characters")
    for number in (int, float):
        try:
            value = number(text)
        except ValueError:
            continue
        if isinstance(value, float) and not math.isfinite(value):
            raise OverrideError(f"{path}: {text!r} is not a finite number")
        return value
    try:
        value = load_yaml(text, MAX_VALUE_CHARS)
    except (UnsafeYamlError, ValueError) as err:
        raise OverrideError(f"{path}: cannot read the value {text!r}: {err}") from None
    try:  # YAML's dates and the like are not config values (nor JSON): the text as written is
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return text
    return value


def check_path(path: Any) -> str:
    if not isinstance(path, str) or not (PATH.match(path) or path in TOP_LEVEL):
        raise OverrideError(f"{str(path)[:60]!r}: expected a dotted config field such as train.lr "
                            f"(or {', '.join(TOP_LEVEL)})")
    if path in OWN_FIELDS:
        raise OverrideError(f"{path}: not an override, {OWN_FIELDS[path]}")
    return path


def check_value(path: str, value: Any) -> Any:
    if isinstance(value, dict):
        raise OverrideError(f"{path}: set the fields of a section one by one ({path}.<field>=...), not a mapping")
    if isinstance(value, float) and not math.isfinite(value):
        raise OverrideError(f"{path}: must be a finite number")
    return value


def parse_overrides(raw: Any) -> dict[str, Any]:
    """Text (one ``field=value`` a line, or comma-free lines; # comments) or a JSON object
    {field: value} -> {dotted field: value}; OverrideError names the first bad one."""
    if raw in (None, "", {}):
        return {}
    if isinstance(raw, str):
        pairs = []
        for line in raw.splitlines():
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            path, sep, value = line.partition("=")
            if not sep:
                raise OverrideError(f"{line[:60]!r}: expected field=value, e.g. train.lr=3e-4")
            path = check_path(path.strip())
            pairs.append((path, parse_value(value, path)))
    elif isinstance(raw, dict):
        pairs = [(check_path(path), value) for path, value in raw.items()]
    else:
        raise OverrideError(f"expected field=value lines or a JSON object, got {type(raw).__name__}")
    found: dict[str, Any] = {}
    for path, value in pairs:
        if path in found:
            raise OverrideError(f"{path}: set twice")
        found[path] = check_value(path, value)
    if len(found) > MAX_OVERRIDES:
        raise OverrideError(f"at most {MAX_OVERRIDES} overrides per launch (got {len(found)})")
    return found


def parse_sweep_values(path: str, raw: Any) -> list[Any]:
    """Comma-separated text or a JSON list -> 2 to MAX_SWEEP_VALUES distinct values of ``path``."""
    if isinstance(raw, str):
        values = [parse_value(v, path) for v in raw.split(",") if v.strip()]
    elif isinstance(raw, list):
        values = list(raw)
    else:
        raise OverrideError(f"{path}: expected comma-separated values or a JSON list")
    values = [check_value(path, v) for v in values]
    if not 2 <= len(values) <= MAX_SWEEP_VALUES:
        raise OverrideError(f"{path}: a sweep takes 2 to {MAX_SWEEP_VALUES} values (got {len(values)})")
    if len({repr(v) for v in values}) < len(values):
        raise OverrideError(f"{path}: a value is listed twice")
    return values


def format_override(path: str, value: Any) -> str:
    return f"{path}={value}"
