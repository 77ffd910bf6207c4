"""Which core each process of a run gets (standard library only: the boot imports it before
torch)."""

from __future__ import annotations

import os


def available_cores() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def core_plan(n_workers: int, pin: bool) -> tuple[int | None, list[int | None]]:
    """(learner core, one core per worker): the learner alone on the first core, the workers
    round-robin over the others; no pinning on one core or when ``pin`` is off."""
    cores = available_cores()
    if not pin or len(cores) < 2:
        return None, [None] * n_workers
    return cores[0], [cores[1 + w % (len(cores) - 1)] for w in range(n_workers)]


def pin_process(core: int | None) -> None:
    """Every thread of this process on ``core`` (None: leave it as it is). ``sched_setaffinity(0)``
    moves only the calling thread: a thread started before the pin (the events flusher of
    ``thundersync train --events``, a worker's outbox feeder) would keep the whole machine, wake
    on the other side's busy core and stall this process's main thread at each GIL hand-off."""
    if core is None or not hasattr(os, "sched_setaffinity"):
        return
    cores = {core % os.cpu_count()}
    try:
        os.sched_setaffinity(0, cores)
        for tid in os.listdir("/proc/self/task"):  # Linux: each thread has its own mask
            try:
                os.sched_setaffinity(int(tid), cores)
            except (OSError, ValueError):
                pass  # the thread ended meanwhile
    except OSError:
        pass  # containers may forbid it; the run still works, only less isolated
