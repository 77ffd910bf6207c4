"""Paths in a run config are the server's, not the user's: where they may point.

A run's learner runs on the server, as the server's user. So a config may read models only
from built-in names or from directories under the configured model roots
(``THUNDERSYNC_MODEL_ROOTS``), data sets only from under ``THUNDERSYNC_DATA_ROOTS``, and
every path it writes (caches, outputs, dumps) must be a relative path inside the run's own
directory, which is the learner's working directory. A reward given as code
('module:function', 'file.py:function') would run on the server: only built-in rewards and
those an admin lists in ``THUNDERSYNC_REWARD_FUNCTIONS`` are allowed.

Fields say which kind they are with ``json_schema_extra={"server_path": "model"}`` (read
from a model root) or ``"run"`` (written under the run directory), or are named in
``FIELD_KINDS``; an unmarked plain string field whose name looks like a path (``*_dir``,
``*_path``, ``*_file``, ``output*``, ``dump*``) is treated as ``"run"``, so a new path knob
is confined until someone decides otherwise.

A reasoning-gym generator's options (``task.datasets[i].config``) are checked by
``learner.gym_options``: an option that opens a file may name only reasoning_gym's own
data files or a file under the data roots, every other text option must be one known to name
no file, and unknown options are refused (``GENERATOR_FIELDS``).
"""

import os
import re
from pathlib import Path, PurePosixPath
from typing import Iterator, Optional

from django.conf import settings
from pydantic import BaseModel

from learner.config import ConfigError, RunConfig, parse_config
from learner.preflight import builtin_problem, check_vllm_speculation
from learner.gym_options import task_problem

BUILTIN_PREFIX = "builtin:"
PATH_LIKE = re.compile(r"(^|_)(dir|path|file|output|dump)s?$|^(output|dump)")
FIELD_KINDS = {"task.path": "data", "task.reward": "code", "tracking.tensorboard": "run"}
# Plain-text fields that name no file: every other string field of RunConfig has a kind above
# or by its marker/name (tests/controller/test_config_paths.py fails on a new unclassified one).
NOT_PATHS = ("name", "task.name", "task.prompt_field", "task.answer_field", "task.system_prompt",
             "task.prompt_preamble", "task.reward_pattern", "task.datasets.name", "model.lora.target_modules", "learner.nodes",
             "cluster.address")  # a Ray address (auto, env, host:port, ray://host:port), not a file
# Generator options: checked option by option against the server's data roots (check_generators).
GENERATOR_FIELDS = ("task.datasets.config",)
BUILTIN_REWARDS = ("exact-match", "regex", "math-verify")


def path_kind(dotted: str, name: str, field) -> str | None:
    if dotted in FIELD_KINDS:
        return FIELD_KINDS[dotted]
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    if "server_path" in extra:
        return extra["server_path"]
    plain_text = field.annotation in (str, str | None, Optional[str])  # not a Literal of choices
    return "run" if plain_text and PATH_LIKE.search(name) else None


def path_fields(model: BaseModel, prefix: str = "") -> Iterator[tuple[str, str, object]]:
    """(dotted name, kind, value) of every path-valued field set in ``model``."""
    for name, field in type(model).model_fields.items():
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            yield from path_fields(value, f"{prefix}{name}.")
        elif (kind := path_kind(f"{prefix}{name}", name, field)) is not None and value is not None:
            yield f"{prefix}{name}", kind, value


def roots(setting: str) -> list[Path]:
    return [Path(os.path.realpath(root)) for root in getattr(settings, setting)]


def under(path: Path, allowed: list[Path]) -> bool:
    real = Path(os.path.realpath(path))
    return any(real == r or r in real.parents for r in allowed)


def refuse(field: str, value: str, what: str, allowed: list[Path], setting: str) -> ConfigError:
    where = ", ".join(str(r) for r in allowed) or f"none is configured ({setting})"
    return ConfigError(f"{field}: {value!r} is not {what} under a root the server allows ({where})")


def check_model_dir(field: str, value: str) -> None:
    if value.startswith(BUILTIN_PREFIX):
        if problem := builtin_problem(field, value):
            raise ConfigError(problem)
        return
    allowed, path = roots("THUNDERSYNC_MODEL_ROOTS"), Path(os.path.expanduser(value))
    if not (path.is_absolute() and under(path, allowed)):
        raise refuse(field, value, "a built-in model (builtin:tiny, builtin:teacher) or an absolute directory",
                     allowed, "THUNDERSYNC_MODEL_ROOTS")


def check_data_path(field: str, value: str) -> None:
    """An absolute path under a data root, or a relative one naming the data shipped in
    configs/data/ (the learner resolves those against the project root)."""
    shipped = Path(os.path.realpath(settings.BASE_DIR / "configs" / "data"))
    allowed, path = [*roots("THUNDERSYNC_DATA_ROOTS"), shipped], Path(os.path.expanduser(value))
    if not under(path if path.is_absolute() else settings.BASE_DIR / path, allowed) or value.startswith("~"):
        raise refuse(field, value, "a data set", allowed, "THUNDERSYNC_DATA_ROOTS")


def check_reward(field: str, value: str) -> None:
    if value in BUILTIN_REWARDS or value in settings.THUNDERSYNC_REWARD_FUNCTIONS:
        return
    raise ConfigError(f"{field}: {value!r} would run code on the server; use {', '.join(BUILTIN_REWARDS)} "
                      "or a function an admin allows (THUNDERSYNC_REWARD_FUNCTIONS)")


def check_run_relative(field: str, value: str) -> None:
    path = PurePosixPath(value)
    if not value or value.startswith("~") or path.is_absolute() or ".." in path.parts or "\\" in value:
        raise ConfigError(f"{field}: {value!r} must be a relative path inside the run's directory "
                          "(no leading /, ~ or ..)")


def run_dir_escape(config: dict, run_dir: Path) -> str | None:
    """Why a path the learner writes would leave ``run_dir`` once symlinks are followed (one
    planted inside it, e.g. by an earlier run's output), or None. Checked when the run starts,
    on the directory itself; the text of each path was checked when the config was saved. A
    config that does not parse is left to the learner, which reports why."""
    try:
        parsed = parse_config(config)
    except ConfigError:
        return None
    home = Path(os.path.realpath(run_dir))
    for field, kind, value in path_fields(parsed):
        if kind == "run" and isinstance(value, str) and not under(home / value, [home]):
            return (f"{field}: {value!r} leads outside the run's directory "
                    f"(to {os.path.realpath(home / value)}, through a symlink)")
    return None


def check_generators(config: RunConfig) -> None:
    """Every reasoning-gym generator option against the server's own data roots (the trainer's
    config validation checked them against its environment's: the same setting in production)."""
    if config.task.datasets:
        problem = task_problem([d.model_dump() for d in config.task.datasets],
                               [str(r) for r in roots("THUNDERSYNC_DATA_ROOTS")])
        if problem:
            raise ConfigError(problem)


CHECKS = {"model": check_model_dir, "data": check_data_path, "code": check_reward, "run": check_run_relative}


def check_server_paths(config: RunConfig) -> None:
    """Raise ConfigError naming the first field whose path the server must not use, or (once the
    paths are allowed) what the trainer's preflight would refuse about the model they name."""
    for field, kind, value in path_fields(config):
        if not isinstance(value, str):
            raise ConfigError(f"{field}: expected a path string")
        CHECKS[kind](field, value)
    check_generators(config)
    check_vllm_speculation(config)
