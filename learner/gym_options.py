"""What a run config may set in a reasoning-gym generator's options (``task.datasets[i].config``).

A generator runs as the trainer's user (on the web app's server: the worker's), and some of
its options are opened as files: ``spell_backward``'s ``data_file`` is joined to
reasoning_gym's data directory, so an absolute path reads any file the process can read. So
every option is checked before anything is generated (``task_problem``, from the config's
own validation, so the command line refuses what the web app refuses):

- the dataset is a registered generator, not ``composite`` (whose nested datasets would
  escape these checks: list them in ``task.datasets``);
- every key is an option of that generator's config dataclass, and its value has the
  option's type (a string reaches only a text option);
- an option that names a file (``FILE_OPTIONS``) names one of reasoning_gym's own data files
  (a relative name that stays inside its data directory) or a file under a data root
  (``THUNDERSYNC_DATA_ROOTS``); the refusal is the same whether the file exists or not;
- every other text option is one known to name no file (``TEXT_OPTIONS``): one a new
  reasoning_gym version adds is refused until it is classified (tests/learner/test_gym_options.py
  enumerates every generator's options and fails on an unclassified one);
- settings whose cost grows exponentially are capped (``COST_CAPS``);
- the generator's own ``validate()`` accepts the options.

Keys named like a path, and capped settings, are checked before reasoning_gym is imported
(which takes seconds), so such a config is refused in milliseconds. What an item costs to generate is measured by ``gym_probe``.
"""

from __future__ import annotations

import dataclasses
import os
import re
import typing
from pathlib import Path, PurePosixPath
from typing import Any, Iterable

# options opened as files: (generator, option) -> what the value must name
FILE_OPTIONS = {("spell_backward", "data_file"): "data", ("figlet_font", "static_font"): "font"}
# text options that name no file: choices, words, names, delimiters (read as text into prompts)
TEXT_OPTIONS = frozenset({
    ("advanced_geometry", "task_types"), ("aiw", "male_names"), ("aiw", "female_names"),
    ("arc_agi", "board_format_opts"), ("arc_agi", "rotations"), ("arc_agi", "mirrors"),
    ("basic_arithmetic", "operators"), ("boxnet", "colour_list"), ("caesar_cipher", "delimiter"),
    ("calendar_arithmetic", "tasks"), ("complex_arithmetic", "operations"), ("countdown", "operators"),
    ("family_relationships", "male_names"), ("family_relationships", "female_names"),
    ("figlet_font", "static_word"), ("fraction_simplification", "styles"),
    ("intermediate_integration", "problem_types"), ("intermediate_integration", "symbols"),
    ("intermediate_integration", "operators"), ("polynomial_equations", "operators"),
    ("polynomial_multiplication", "variables"), ("polynomial_multiplication", "operators"),
    ("puzzle24", "operators"), ("rearc", "board_format_opts"), ("simple_equations", "operators"),
    ("simple_integration", "operators"), ("simple_integration", "symbols"), ("time_intervals", "task_types"),
})
# settings whose generation cost is exponential in them: (generator, option) -> the largest
# allowed (tower_of_hanoi: 2^disks - 1 moves; 15 disks is reasoning-gym's own hardest
# curriculum level, a 1 MB answer made in 0.1 s; 22 disks took 26 s and 2.5 GB a step)
COST_CAPS = {("tower_of_hanoi", "min_disks"): 15, ("tower_of_hanoi", "max_disks"): 15}
NESTED = ("composite",)  # generators whose options hold other generators' options
PATH_LIKE = re.compile(r"(^|_)(dir|path|file|font|output|dump)s?$|^(output|dump)")
DATA_ROOTS_ENV = "THUNDERSYNC_DATA_ROOTS"


def env_data_roots() -> list[str]:
    """The data roots the trainer's own environment allows (the web app's setting of the same name)."""
    return [p for p in os.environ.get(DATA_ROOTS_ENV, "").split(os.pathsep) if p]


def gym_data_dir() -> Path:
    """reasoning_gym's data directory, found without importing reasoning_gym (its import takes seconds)."""
    import importlib.util

    spec = importlib.util.find_spec("reasoning_gym")
    if spec is None or not spec.submodule_search_locations:
        return Path("/nonexistent/reasoning_gym/data")
    return Path(list(spec.submodule_search_locations)[0]) / "data"


def inside(path: str | Path, roots: Iterable[str | Path]) -> bool:
    real = Path(os.path.realpath(path))
    for root in roots:
        top = Path(os.path.realpath(root))
        if real == top or top in real.parents:
            return True
    return False


def file_problem(field: str, value: Any, kind: str, data_roots: list[str]) -> str | None:
    """Why ``value`` may not be given to an option that opens it as a file, or None. Decided on
    the text and on where it resolves, never on whether the file exists."""
    if kind == "font":
        ok = isinstance(value, str) and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_+-]{0,63}", value) is not None
        return None if ok or value is None else f"{field}: {value!r} is not a font name (letters, digits, _ + -)"
    where = ", ".join(data_roots) or f"none is configured ({DATA_ROOTS_ENV})"
    refused = (f"{field}: {value!r} is neither one of reasoning-gym's own data files (a name such as "
               f"'words3to10.txt') nor a file under a data root the server allows ({where})")
    if not isinstance(value, str) or not value or "\x00" in value or "\\" in value or value.startswith("~"):
        return refused
    path = PurePosixPath(value)
    if ".." in path.parts:
        return refused
    if path.is_absolute():
        return None if data_roots and inside(value, data_roots) else refused
    base = gym_data_dir()
    return None if inside(base / value, [base]) else refused


def cap_problem(field: str, name: str, key: Any, value: Any) -> str | None:
    cap = COST_CAPS.get((name, key))
    if cap is not None and isinstance(value, (int, float)) and not isinstance(value, bool) and value > cap:
        return (f"{field}: {value} is over {name}'s limit of {cap} (the work to generate an item grows "
                f"exponentially with it)")
    return None


def named_like_paths(datasets: list, data_roots: list[str]) -> str | None:
    """The first problem of a path-named or capped option, checked on the text alone (no import)."""
    for i, spec in enumerate(datasets):
        for key, value in (spec.get("config") or {}).items():
            if problem := cap_problem(f"task.datasets[{i}].config.{key}", spec.get("name"), key, value):
                return problem
            kind = FILE_OPTIONS.get((spec.get("name"), key))
            if kind is None and isinstance(key, str) and PATH_LIKE.search(key) and isinstance(value, str):
                kind = "data"
            if kind is not None and (problem := file_problem(f"task.datasets[{i}].config.{key}", value, kind,
                                                             data_roots)):
                return problem
    return None


def holds_text(hint: Any) -> bool:
    """Whether a value of type ``hint`` can hold a free string (so could name a file)."""
    if hint is str or hint is Any or isinstance(hint, (str, typing.ForwardRef)):
        return True
    if hint in (tuple, list, dict, set, frozenset, typing.Sequence):
        return True
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        hints = typing.get_type_hints(hint)
        return any(holds_text(hints[f.name]) for f in dataclasses.fields(hint))
    origin = typing.get_origin(hint)
    if origin is None or origin is typing.Literal:
        return False
    args = [a for a in typing.get_args(hint) if a is not Ellipsis]
    return not args or any(holds_text(a) for a in args)


def options(name: str) -> dict[str, Any]:
    """A registered generator's options: name -> type."""
    from reasoning_gym.factory import DATASETS

    config_cls = DATASETS[name][1]
    hints = typing.get_type_hints(config_cls)
    return {f.name: hints.get(f.name, Any) for f in dataclasses.fields(config_cls)}


def value_problem(field: str, hint: Any, value: Any) -> str | None:
    """Why ``value`` is not of type ``hint`` (pydantic's lax reading: 3 for a float is fine)."""
    from pydantic import TypeAdapter, ValidationError

    try:
        adapter = TypeAdapter(hint)
    except Exception:  # a type pydantic cannot read: only the generator's own validate() checks it
        return None
    try:
        adapter.validate_python(value)
    except ValidationError as err:
        first = err.errors()[0]
        where = "".join(f"[{x}]" for x in first["loc"])
        return f"{field}{where}: {first['msg'].lower()} (got {value!r:.60})"
    return None


def option_problem(i: int, name: str, key: Any, value: Any, known: dict[str, Any],
                   data_roots: list[str]) -> str | None:
    field = f"task.datasets[{i}].config.{key}"
    if key not in known:
        return f"{field}: not an option of {name} (its options: {', '.join(sorted(known))})"
    if (kind := FILE_OPTIONS.get((name, key))) is not None:
        if problem := file_problem(field, value, kind, data_roots):
            return problem
    elif holds_text(known[key]) and (name, key) not in TEXT_OPTIONS:
        return f"{field}: a text option of {name} that is not known to name no file; leave it at its default"
    if problem := value_problem(field, known[key], value):
        return problem
    return cap_problem(field, name, key, value)


def generator_problem(i: int, name: str, config: dict) -> str | None:
    """The generator's own ``validate()`` on the options (its asserts), one line."""
    from reasoning_gym.factory import DATASETS

    try:
        built = DATASETS[name][1](**config)
        if hasattr(built, "validate"):
            built.validate()
    except Exception as err:  # its asserts, and whatever its __post_init__ raises
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return f"task.datasets[{i}].config: {name} refuses these options: {reason}"
    return None


def task_problem(datasets: list, data_roots: list[str] | None = None) -> str | None:
    """The first problem of ``task.datasets`` (dicts: name, weight, config), one line naming the
    field, or None. ``data_roots``: where a generator may read a file of the user's (default:
    ``THUNDERSYNC_DATA_ROOTS`` of this process's environment)."""
    roots = env_data_roots() if data_roots is None else list(data_roots)
    if problem := named_like_paths(datasets, roots):
        return problem
    from reasoning_gym.factory import DATASETS

    for i, spec in enumerate(datasets):
        name, config = spec.get("name"), spec.get("config") or {}
        if name in NESTED:
            return f"task.datasets[{i}].name: {name!r} nests other datasets; list them in task.datasets instead"
        if name not in DATASETS:
            return f"task.datasets[{i}].name: unknown reasoning-gym dataset {name!r}"
        known = options(name)
        for key, value in config.items():
            if problem := option_problem(i, name, key, value, known, roots):
                return problem
        if problem := generator_problem(i, name, config):
            return problem
    return None
