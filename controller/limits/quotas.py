"""Per-user quotas: trajectories and tokens per step, steps per run, processes and GPUs per run,
generator sizes, checkpoints kept, disk per user, runs at once, runs waiting.

Site defaults are ``THUNDERSYNC_QUOTA_DEFAULTS``; a ``UserQuota`` row (admin) overrides
any of them for one user. Config limits are checked when an experiment is saved and again
when a run is launched (an admin may have lowered them since); the queued-runs limit at
launch; the concurrent-runs limit by the dispatcher, which leaves a user's extra runs
queued (controller/supervision/dispatch.py). docs/controller-api.md, "Security and fair use".

The queued-runs check and the insert it guards run in one transaction holding a row lock on
the user (``SELECT ... FOR UPDATE``), so parallel launches of one user are counted one after
the other and never pass the limit together; other users are not held up.
"""

from dataclasses import dataclass

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction

from controller.limits import run_cost
from controller.models import Run, UserQuota

LIMITS = ("trajectories_per_step", "steps", "concurrent_runs", "queued_runs", "rollout_workers",
          "learner_world_size", "task_size", "processes", "tokens_per_step", "generator_setting",
          "keep_checkpoints", "disk_mb", "gpus")
# Per-run resources: config path -> the quota that bounds it (processes, generated items, disk).
RESOURCE_LIMITS = {"rollout.workers": "rollout_workers", "rollout.replicas": "rollout_workers",
                   "learner.world_size": "learner_world_size", "task.size": "task_size",
                   "train.keep_checkpoints": "keep_checkpoints"}
# A launch names the input that is over: its own steps, or the experiment's config (any other
# config path: controller/launch_input.py).
LAUNCH_FIELDS = {"train.steps": "steps", "train.prompts_per_step": "experiment",
                 **{path: "experiment" for path in RESOURCE_LIMITS}}


@dataclass(frozen=True)
class Quota:
    trajectories_per_step: int
    steps: int
    concurrent_runs: int
    queued_runs: int
    rollout_workers: int
    learner_world_size: int
    task_size: int
    processes: int
    tokens_per_step: int
    generator_setting: int
    keep_checkpoints: int
    disk_mb: int
    gpus: int


class QuotaExceeded(Exception):
    """``field``: the input that is over (a config path, ``steps``, or ``quota``); ``inputs``:
    every config path the bounded quantity is computed from (a sweep or override of any of
    them is what a launch names)."""

    def __init__(self, field: str, message: str, status: int = 400, inputs: tuple[str, ...] = ()):
        super().__init__(message)
        self.field, self.message, self.status = field, message, status
        self.inputs = set(inputs) | {field}


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


def check_config(user, config: dict) -> None:
    """A validated config (as a dict, every default filled in) within the user's quota; else
    QuotaExceeded whose field is the config path that is over."""
    quota = quota_for(user)
    for path, limit in RESOURCE_LIMITS.items():
        section, name = path.split(".")
        value, bound = config[section][name], getattr(quota, limit)
        if value > bound:
            raise QuotaExceeded(path, f"{path} = {value} is over your quota of {bound}")
    train = config["train"]
    per_step, group = train["prompts_per_step"], train["group_size"]
    if per_step * group > quota.trajectories_per_step:
        raise QuotaExceeded("train.prompts_per_step", (
            f"train.prompts_per_step × train.group_size = {per_step} × {group} = {per_step * group} "
            f"trajectories per step, over your quota of {quota.trajectories_per_step}"),
            inputs=("train.group_size",))
    if train["steps"] > quota.steps:
        raise QuotaExceeded("train.steps", f"train.steps = {train['steps']} is over your quota of {quota.steps} steps per run")
    check_cost(quota, config)


def check_cost(quota: Quota, config: dict) -> None:
    """What the run costs beyond counts (controller/limits/run_cost.py): its processes, the tokens of
    a step, its evaluations' samples per step, the sizes its task generator is asked for."""
    for cost, bound, what in ((run_cost.processes(config), quota.processes, "processes per run"),
                              (run_cost.gpus(config), quota.gpus, "GPUs per run"),
                              (run_cost.tokens_per_step(config), quota.tokens_per_step, "tokens per step")):
        if cost.value > bound:
            raise QuotaExceeded(cost.inputs[0], f"{cost.formula}, over your quota of {bound} {what}",
                                inputs=cost.inputs)
    evaluation = run_cost.eval_samples_per_step(config)  # the same sample quota as a training step's
    if evaluation.value > quota.trajectories_per_step:
        raise QuotaExceeded(evaluation.inputs[0], f"{evaluation.formula}, over your quota of "
                            f"{quota.trajectories_per_step} trajectories per step", inputs=evaluation.inputs)
    for path, value in run_cost.dataset_sizes(config):
        if value > quota.task_size:
            raise QuotaExceeded(path, f"{path} = {value} is over your quota of {quota.task_size} (task_size)")
    for path, value in run_cost.generator_settings(config):
        if abs(value) > quota.generator_setting:
            raise QuotaExceeded(path, (f"{path} = {value} is over your quota of {quota.generator_setting} for a "
                                       "task generator's setting (terms, digits, sizes of what it generates)"))


def check_queue(user) -> None:
    """Room in the user's queue; call it inside the transaction that queues the run: it locks
    the user's row until that transaction ends."""
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("check_queue must run in the transaction that queues the run")
    get_user_model().objects.select_for_update().filter(pk=user.pk).exists()
    quota = quota_for(user)
    waiting = Run.objects.filter(experiment__owner=user, status=Run.Status.QUEUED).count()
    if waiting >= quota.queued_runs:
        raise QuotaExceeded("quota", (
            f"you already have {waiting} queued runs, your quota is {quota.queued_runs}: "
            "wait for one to start or cancel one"), status=429)


# Objects a user may keep stored (settings THUNDERSYNC_MAX_EXPERIMENTS_PER_USER and
# THUNDERSYNC_MAX_RUNS_PER_USER): every list, page and export of theirs stays bounded.
STORED_LIMITS = {"experiments": "THUNDERSYNC_MAX_EXPERIMENTS_PER_USER", "runs": "THUNDERSYNC_MAX_RUNS_PER_USER"}


def check_stored(user, kind: str) -> None:
    """Room for one more of ``kind`` ("experiments" or "runs") among the user's stored objects,
    else QuotaExceeded (409) naming the limit. Call it in the transaction that inserts: it locks
    the user's row, so parallel creations are counted one after the other."""
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("check_stored must run in the transaction that stores the object")
    get_user_model().objects.select_for_update().filter(pk=user.pk).exists()
    setting = STORED_LIMITS[kind]
    limit = getattr(settings, setting)
    stored = (Run.objects.filter(experiment__owner=user) if kind == "runs" else user.experiments).count()
    if stored >= limit:
        raise QuotaExceeded("quota", (
            f"you have {stored} {kind} stored, the limit is {limit} per user ({setting}): "
            f"delete some to make room"), status=409)
