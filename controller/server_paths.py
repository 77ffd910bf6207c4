"""Paths in a run config are the server's, not the user's: where they may point.

A run's learner runs on the server, as the server's user. So a config may read models only
from built-in names or from directories under the configured model roots
(``THUNDERSYNC_MODEL_ROOTS``), and every path it writes (caches, outputs, dumps) must be a
relative path inside the run's own directory, which is the learner's working directory.

Fields say which kind they are with ``json_schema_extra={"server_path": "model"}`` (read
from a model root) or ``"run"`` (written under the run directory); an unmarked string field
whose name looks like a path (``*_dir``, ``*_path``, ``*_file``, ``output*``, ``dump*``) is
treated as ``"run"``, so a new path knob is confined until someone decides otherwise.
"""

import os
import re
from pathlib import Path, PurePosixPath
from typing import Iterator

from django.conf import settings
from pydantic import BaseModel

from learner.config import ConfigError, RunConfig

BUILTIN_PREFIX = "builtin:"
PATH_LIKE = re.compile(r"(^|_)(dir|path|file|output|dump)s?$|^(output|dump)")


def path_kind(name: str, field) -> str | None:
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    if "server_path" in extra:
        return extra["server_path"]
    return "run" if PATH_LIKE.search(name) else None


def path_fields(model: BaseModel, prefix: str = "") -> Iterator[tuple[str, str, object]]:
    """(dotted name, kind, value) of every path-valued field set in ``model``."""
    for name, field in type(model).model_fields.items():
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            yield from path_fields(value, f"{prefix}{name}.")
        elif (kind := path_kind(name, field)) is not None and value is not None:
            yield f"{prefix}{name}", kind, value


def model_roots() -> list[Path]:
    return [Path(os.path.realpath(root)) for root in settings.THUNDERSYNC_MODEL_ROOTS]


def check_model_dir(field: str, value: str) -> None:
    if value.startswith(BUILTIN_PREFIX):
        return  # the learner knows its built-in names and refuses others
    roots = model_roots()
    real = Path(os.path.realpath(os.path.expanduser(value)))
    if Path(os.path.expanduser(value)).is_absolute() and any(real == r or r in real.parents for r in roots):
        return
    where = ", ".join(str(r) for r in roots) or "none is configured (THUNDERSYNC_MODEL_ROOTS)"
    raise ConfigError(f"{field}: {value!r} is not a built-in model (builtin:tiny, builtin:teacher) "
                      f"or an absolute directory under a model root ({where})")


def check_run_relative(field: str, value: str) -> None:
    path = PurePosixPath(value)
    if not value or value.startswith("~") or path.is_absolute() or ".." in path.parts or "\\" in value:
        raise ConfigError(f"{field}: {value!r} must be a relative path inside the run's directory "
                          "(no leading /, ~ or ..)")


def check_server_paths(config: RunConfig) -> None:
    """Raise ConfigError naming the first field whose path the server must not use."""
    for field, kind, value in path_fields(config):
        if not isinstance(value, str):
            raise ConfigError(f"{field}: expected a path string")
        (check_model_dir if kind == "model" else check_run_relative)(field, value)
