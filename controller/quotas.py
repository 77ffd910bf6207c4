"""Per-user quotas: trajectories per step, steps per run, runs at once, runs waiting.

Site defaults are ``THUNDERSYNC_QUOTA_DEFAULTS``; a ``UserQuota`` row (admin) overrides
any of them for one user. Config limits are checked when an experiment is saved and again
when a run is launched (an admin may have lowered them since); the queued-runs limit at
launch; the concurrent-runs limit by the dispatcher, which leaves a user's extra runs
queued (controller/dispatch.py). docs/controller.md, "Security and fair use".
"""

from dataclasses import dataclass

from django.conf import settings

from .models import Run, UserQuota

LIMITS = ("trajectories_per_step", "steps", "concurrent_runs", "queued_runs")
# A launch names the input that is over: its own steps, or the experiment's config.
LAUNCH_FIELDS = {"train.steps": "steps", "train.prompts_per_step": "experiment"}


@dataclass(frozen=True)
class Quota:
    trajectories_per_step: int
    steps: int
    concurrent_runs: int
    queued_runs: int


class QuotaExceeded(Exception):
    """``field``: the input that is over (a config path, ``steps``, or ``quota``)."""

    def __init__(self, field: str, message: str, status: int = 400):
        super().__init__(message)
        self.field, self.message, self.status = field, message, status


def quota_for(user) -> Quota:
    return quotas_for([user.pk])[user.pk]


def quotas_for(user_ids) -> dict[int, Quota]:
    defaults = settings.THUNDERSYNC_QUOTA_DEFAULTS
    rows = {q.user_id: q for q in UserQuota.objects.filter(user_id__in=list(user_ids))}
    out = {}
    for uid in user_ids:
        row = rows.get(uid)
        values = {name: getattr(row, name, None) for name in LIMITS}
        out[uid] = Quota(**{name: defaults[name] if values[name] is None else values[name] for name in LIMITS})
    return out


def check_config(user, train: dict) -> None:
    """A config's ``train`` section (a validated one, as a dict) within the user's quota;
    else QuotaExceeded whose field is the config path that is over."""
    quota = quota_for(user)
    per_step, group = train["prompts_per_step"], train["group_size"]
    if per_step * group > quota.trajectories_per_step:
        raise QuotaExceeded("train.prompts_per_step", (
            f"train.prompts_per_step × train.group_size = {per_step} × {group} = {per_step * group} "
            f"trajectories per step, over your quota of {quota.trajectories_per_step}"))
    if train["steps"] > quota.steps:
        raise QuotaExceeded("train.steps", f"train.steps = {train['steps']} is over your quota of {quota.steps} steps per run")


def check_queue(user) -> None:
    quota = quota_for(user)
    waiting = Run.objects.filter(experiment__owner=user, status=Run.Status.QUEUED).count()
    if waiting >= quota.queued_runs:
        raise QuotaExceeded("quota", (
            f"you already have {waiting} queued runs, your quota is {quota.queued_runs}: "
            "wait for one to start or cancel one"), status=429)
