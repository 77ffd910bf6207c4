"""Disk per user: what a user's run directories hold (config, log, checkpoints, policy),
against the ``disk_mb`` quota (controller/limits/quotas.py). A launch that would pass it is refused
with what is used and what the run may write; a run that grows past it while it trains is
stopped with that reason (``DiskWatch``, polled by the supervisor)."""

import os
import time
from pathlib import Path

from django.conf import settings

from controller.models import Run
from controller.limits.quotas import QuotaExceeded, quota_for
from controller.supervision.runlog import run_dir
from learner.registries.schedules import schedule_kind

MB = 2**20
BUILTIN_WEIGHTS_BYTES = 4 * MB  # the built-in policies are a few hundred kB; counted generously


def tree_bytes(path: Path) -> int:
    """Bytes of the regular files under ``path`` (symlinks not followed; 0 if it is gone)."""
    total, stack = 0, [str(path)]
    while stack:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(entry.path)
                        elif entry.is_file(follow_symlinks=False):
                            total += entry.stat(follow_symlinks=False).st_size
                    except OSError:  # removed meanwhile
                        continue
        except OSError:
            continue
    return total


def used_bytes(user_id: int) -> int:
    return sum(tree_bytes(run_dir(pk)) for pk in Run.objects.filter(experiment__owner_id=user_id)
               .values_list("pk", flat=True))


def weights_bytes(policy: str) -> int:
    if policy.startswith("builtin:"):
        return BUILTIN_WEIGHTS_BYTES
    return sum(p.stat().st_size for p in Path(policy).expanduser().glob("*")
               if p.suffix in (".safetensors", ".bin") and p.is_file())


def run_bytes(config: dict) -> tuple[int, str]:
    """An upper estimate of what a run writes, and how it was reckoned: the final policy, and
    with checkpoints each kept one's model, AdamW's two moments and (async) the behaviour copy."""
    weights = weights_bytes(config["model"]["policy"])
    train = config["train"]
    if not train.get("checkpoint_every"):
        return weights, "the final policy"
    per_checkpoint = 3 + schedule_kind(train["schedule"]).keeps_previous_version
    return (weights * (1 + per_checkpoint * train["keep_checkpoints"]),
            f"the final policy and train.keep_checkpoints = {train['keep_checkpoints']} checkpoints")


def disk_problem(user_id: int, limit_mb: int, config: dict) -> str | None:
    """Why launching ``config`` would pass the user's disk quota, or None."""
    used, (needed, how) = used_bytes(user_id), run_bytes(config)
    if used + needed <= limit_mb * MB:
        return None
    return (f"your runs use {used / MB:.0f} MB and this run may write {needed / MB:.0f} MB ({how}), over your "
            f"disk quota of {limit_mb} MB: delete runs you no longer need")


def check_disk(user, config: dict) -> None:
    """At launch: the user's run directories and what this run may write within their disk
    quota; else QuotaExceeded naming ``disk``."""
    if problem := disk_problem(user.pk, quota_for(user).disk_mb, config):
        raise QuotaExceeded("disk", problem, inputs=("train.keep_checkpoints", "train.checkpoint_every"))


class DiskWatch:
    """A running run's owner's disk use, measured at most every THUNDERSYNC_DISK_CHECK_S."""

    def __init__(self, run_id: int):
        run = Run.objects.select_related("experiment__owner").get(pk=run_id)
        self.user_id, self.limit_mb = run.experiment.owner_id, quota_for(run.experiment.owner).disk_mb
        self.next_check = 0.0

    def over(self) -> str | None:
        """The reason to stop the run once its owner's runs hold more than the quota, else None."""
        now = time.monotonic()
        if now < self.next_check:
            return None
        self.next_check = now + settings.THUNDERSYNC_DISK_CHECK_S
        used = used_bytes(self.user_id)
        if used <= self.limit_mb * MB:
            return None
        return f"disk quota: your runs hold {used / MB:.0f} MB, over your quota of {self.limit_mb} MB"
