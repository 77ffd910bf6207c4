"""A launch's inputs beyond the form: which input a refusal is about, and the sweep asked for.
Shared by the pages (controller/views.py) and the API (controller/jsonapi/api.py)."""

from learner.config import ConfigError

from controller.config_merge import LaunchOverrideError
from controller.supervision.launching import Sweep
from controller.limits.quotas import LAUNCH_FIELDS
from controller.sandbox_hosts import SandboxRefused


def launch_error(err: Exception, schedule_field: str, data: dict) -> tuple[str | None, int, str]:
    """(the launch input at fault, HTTP status, reason) for a config or quota refusal of a launch
    with the cleaned inputs ``data``: the sweep's values or the overrides when the fault is in a
    field they set, else the schedule, or the input quotas.LAUNCH_FIELDS names."""
    swept = data.get("sweep_field") or None
    overridden = set(data.get("overrides") or {})
    if isinstance(err, SandboxRefused):  # the experiment's task, on these workers
        return "experiment", 400, str(err)
    if isinstance(err, LaunchOverrideError):
        about_sweep = swept and str(err).startswith((f"{swept}:", f"{swept}[", f"{swept}."))  # or inside it
        return ("sweep_values" if about_sweep else "overrides"), 400, str(err)
    if isinstance(err, ConfigError):
        return schedule_field, 400, f"does not fit the experiment's config: {err}"
    if swept in err.inputs:
        return "sweep_values", err.status, err.message
    if err.inputs & overridden:
        return "overrides", err.status, err.message
    return LAUNCH_FIELDS.get(err.field, "experiment" if "." in err.field else err.field), err.status, err.message


def sweep_of(data: dict) -> Sweep | None:
    return Sweep(data["sweep_field"], data["sweep_values"]) if data.get("sweep_field") else None
