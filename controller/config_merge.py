"""Build the config a run trains with: experiment config + schedule preset + run overrides."""

from typing import Any

from learner.config import apply_overrides, parse_config

from .server_paths import check_server_paths


def run_config(experiment_config: dict, schedule_overrides: dict[str, Any], steps: int, name: str) -> dict:
    """The full, validated config (every default filled in) as JSON; raises ConfigError."""
    overrides = {**schedule_overrides, "train.steps": steps}
    if name:
        overrides["name"] = name
    config = parse_config(apply_overrides(experiment_config, overrides))
    check_server_paths(config)
    return config.model_dump(mode="json")


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
