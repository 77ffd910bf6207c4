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


def set_process_affinity(cores: set[int]) -> None:
    """Every thread of this process on ``cores``. ``sched_setaffinity(0)`` moves only the calling
    thread (Linux keeps one mask per thread): a thread started before a pin (the events flusher
    of ``thundersync train --events``, a worker's outbox feeder) would keep the whole machine,
    wake on the other side's busy core and hold up this process's main thread at each hand-off
    of the interpreter lock. Threads started later inherit the caller's mask."""
    os.sched_setaffinity(0, cores)
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return  # no /proc: only the calling thread is moved
    for tid in tids:
        try:
            os.sched_setaffinity(int(tid), cores)
        except OSError:
            pass  # the thread ended meanwhile


def pin_process(core: int | None) -> None:
    if core is not None and hasattr(os, "sched_setaffinity"):
        try:
            set_process_affinity({core % os.cpu_count()})
        except OSError:
            pass  # containers may forbid it; the run still works, only less isolated
