"""Build the config a run trains with: experiment config + schedule preset + launch overrides."""

from typing import Any, get_args

from pydantic import BaseModel

from learner.config import ConfigError, RunConfig, apply_overrides, parse_config

from controller.server_paths import check_server_paths


class LaunchOverrideError(ConfigError):
    """A launch's own override does not fit the experiment's config (the launch's ``overrides``
    field is at fault, not the schedule)."""


def run_config(experiment_config: dict, schedule_overrides: dict[str, Any], steps: int, name: str,
               launch_overrides: dict[str, Any] | None = None) -> dict:
    """The full, validated config (every default filled in) as JSON; raises ConfigError.

    ``launch_overrides`` (controller/overrides.py) come after the schedule's, so that a sweep over
    a schedule's knob sets it under every schedule. When the config without them is valid and
    with them is not, the error is the overrides' own: LaunchOverrideError."""
    overrides = {**schedule_overrides, "train.steps": steps}
    if name:
        overrides["name"] = name
    config = validated(apply_overrides(experiment_config, overrides))
    if launch_overrides:
        try:
            config = validated(apply_overrides(experiment_config, {**overrides, **launch_overrides}))
        except ConfigError as err:
            raise LaunchOverrideError(str(err)) from None
    return config.model_dump(mode="json")


def validated(data: dict):
    config = parse_config(data)
    check_server_paths(config)
    return config


def flatten(config: dict, prefix: str = "") -> dict[str, Any]:
    """{'train': {'steps': 2}} -> {'train.steps': 2}, for config diffs."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{path}."))
        else:
            flat[path] = value
    return flat


def config_has_field(dotted: str) -> bool:
    """Whether ``dotted`` names a field of RunConfig (through optional sections too)."""
    model: type[BaseModel] | None = RunConfig
    for part in dotted.split("."):
        if model is None or part not in model.model_fields:
            return False
        annotation = model.model_fields[part].annotation
        model = next((a for a in (annotation, *get_args(annotation))
                      if isinstance(a, type) and issubclass(a, BaseModel)), None)
    return True
