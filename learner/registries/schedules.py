"""The four schedules (docs/schedules.md) as entries: what each one decides, for the driver,
the simulator, the bench and the app alike. ``learner.driver.rules`` holds the pure functions
over these (how far the rollout may lead, when a batch may start)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ScheduleKind:
    name: str
    summary: str
    # trains at staleness 0 with ratio 1 (sync, streaming); the others use importance ratios
    on_policy: bool
    # each trajectory's (or scored turn's) backward runs the moment it arrives
    learns_on_arrival: bool
    # versions the rollout may run ahead of the learner: an int, or None for max_staleness
    lead: int | None
    # the reference every other schedule is compared against (its step is the serial sum)
    baseline: bool = False
    # rollout workers follow the newest published weights mid-batch, the driver dispatches a
    # group's members together and drops groups past max_staleness (fully-async)
    follows_latest: bool = False
    # checkpoints keep the previous version as well (async trains on version v−1)
    keeps_previous_version: bool = False
    # what ``learner.path: auto`` picks (docs/learner.md): streaming's adaptive drain, or one
    # micro-batched pass over a whole batch
    best_learner_path: str = "micro-batched"


SCHEDULE_KINDS: dict[str, ScheduleKind] = {}


def register(kind: ScheduleKind) -> ScheduleKind:
    SCHEDULE_KINDS[kind.name] = kind
    return kind


def schedule_kind(name: str) -> ScheduleKind:
    try:
        return SCHEDULE_KINDS[name]
    except KeyError:
        raise KeyError(f"train.schedule: {name!r} is not one of {', '.join(SCHEDULE_KINDS)}") from None


SYNC = register(ScheduleKind("sync", "generate the whole batch, then learn it", True, False, 0, baseline=True))
ASYNC = register(ScheduleKind("async", "generate batch j+1 while learning batch j (one step stale)", False, False, 1,
                              keeps_previous_version=True))
FULLY_ASYNC = register(ScheduleKind("fully-async", "workers never wait; groups up to max_staleness old", False, False,
                                    None, follows_latest=True))
STREAMING = register(ScheduleKind("streaming", "learn each trajectory as it arrives; one exact step per batch",
                                  True, True, 0, best_learner_path="adaptive"))
NAMES: tuple[str, ...] = tuple(SCHEDULE_KINDS)
BASELINE: str = next(k.name for k in SCHEDULE_KINDS.values() if k.baseline)  # what speedups are measured against
ON_POLICY: tuple[str, ...] = tuple(k.name for k in SCHEDULE_KINDS.values() if k.on_policy)
