"""CPU % and resident memory per process of the run (``system/<process>/...``): the driver
(which is also the learner when it has one rank), the learner's rank processes and this node's
rollout workers; on a GPU also the driver's GPU memory and utilisation. Read from /proc through
psutil, a few reads per process: nothing on the learner's hot path. Two cadences: at each step's
end (into the step's metrics), and every ``tracking.system_every_s`` seconds of wall clock by
``SystemSampler`` (``system`` events: a step of minutes on a GPU node still gets a curve, as W&B
and Ray sample every few seconds; a run of seconds gets one too: the interval starts at 0.2 s)."""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Callable

import psutil
import torch

from learner.timeline import Metric

MB = 2.0**20


class ProcessSampler:
    """Per process, its CPU seconds since the previous sample over the wall time between them."""

    def __init__(self) -> None:
        self._procs: dict[int, psutil.Process] = {}
        self._last: dict[int, tuple[float, float]] = {}  # pid -> (cpu seconds, monotonic time)

    def _process(self, pid: int) -> psutil.Process:
        proc = self._procs.get(pid)
        if proc is None:
            proc = self._procs[pid] = psutil.Process(pid)
        return proc

    def sample(self, pids: dict[str, int]) -> dict[str, float]:
        """``pids``: process name -> pid. A process gone (a worker restarted) is left out; its
        successor's CPU % starts at its second sample."""
        values, now = {}, time.monotonic()
        for name, pid in pids.items():
            try:
                proc = self._process(pid)
                with proc.oneshot():
                    times = proc.cpu_times()
                    rss = proc.memory_info().rss
            except psutil.Error:
                self._procs.pop(pid, None)
                continue
            cpu = times.user + times.system
            prev = self._last.get(pid)
            self._last[pid] = (cpu, now)
            if prev is not None and now > prev[1]:
                values[f"{Metric.SYSTEM}{name}/cpu_percent"] = 100.0 * (cpu - prev[0]) / (now - prev[1])
            values[f"{Metric.SYSTEM}{name}/rss_mb"] = rss / MB
        return values


def run_pids(learner_pids: list[int], worker_procs: list) -> dict[str, int]:
    """Names of this node's processes of the run: ``driver``, ``learner_rank<k>``, ``rollout_<w>``."""
    pids = {"driver": os.getpid()}
    pids.update({f"learner_rank{k}": pid for k, pid in enumerate(learner_pids) if pid != os.getpid()})
    pids.update({f"rollout_{w}": p.pid for w, p in enumerate(worker_procs) if getattr(p, "pid", None)})
    return pids


def gpu_metrics(device: torch.device) -> dict[str, float]:
    """The driver's GPU: memory reserved by torch, and utilisation where NVML is there to say it."""
    if device.type != "cuda":
        return {}
    values = {f"{Metric.SYSTEM}driver/gpu_memory_mb": torch.cuda.memory_reserved(device) / MB}
    try:
        values[f"{Metric.SYSTEM}driver/gpu_util"] = float(torch.cuda.utilization(device))
    except Exception:  # no pynvml / NVML: utilisation is unknown, not 0
        pass
    return values


def gpu_roles(placement) -> dict[int, str]:
    """GPU index -> the roles placed on it ("learner", "rollout", "learner+rollout", ...)."""
    roles: dict[int, list[str]] = {}
    for role, gpus in (("learner", placement.learner), ("rollout", placement.rollout),
                       ("teacher", [] if placement.teacher is None else [placement.teacher])):
        for g in gpus:
            roles.setdefault(g, []).append(role)
    return {g: "+".join(r) for g, r in sorted(roles.items())}


def placed_gpu_metrics(placement) -> dict[str, float]:
    """Every placed GPU of this node, whichever process uses it: ``system/gpu<i>_<roles>/gpu_util``
    and ``.../gpu_memory_mb`` (device-wide, from NVML; left out where NVML cannot say)."""
    values = {}
    for g, role in gpu_roles(placement).items():
        name = f"{Metric.SYSTEM}gpu{g}_{role}"
        try:
            values[f"{name}/gpu_memory_mb"] = torch.cuda.device_memory_used(g) / MB
            values[f"{name}/gpu_util"] = float(torch.cuda.utilization(g))
        except Exception:  # no pynvml / NVML
            continue
    return values


def node_name() -> str:
    """The node a run's samples come from: the Celery worker's ``THUNDERSYNC_NODE`` (the app's
    name for it), else the host name."""
    return os.environ.get("THUNDERSYNC_NODE") or socket.gethostname()


# The adaptive interval: a run's length is unknown while it runs, so the sampler starts fast and
# slows down to ``every_s``: the interval at time t after the start is t / SAMPLES_PER_RUN, within
# [SAMPLE_FLOOR_S, every_s]. Over a run of T seconds its last half then holds at least
# SAMPLES_PER_RUN / 2 samples wherever T >= SAMPLES_PER_RUN x SAMPLE_FLOOR_S (4 s), and a longer
# run at least T / every_s: at least 10 points over any run of 4 s or more.
SAMPLES_PER_RUN = 20
SAMPLE_FLOOR_S = 0.2


def sample_interval(elapsed_s: float, every_s: float) -> float:
    """Seconds to the next sample, ``elapsed_s`` after the sampler started (``every_s`` the most)."""
    return min(every_s, max(SAMPLE_FLOOR_S, elapsed_s / SAMPLES_PER_RUN))


class SystemSampler:
    """A daemon thread that samples the run's processes (its own ``ProcessSampler``: CPU % over
    its own interval) at an interval growing from SAMPLE_FLOOR_S to ``every_s`` seconds
    (``sample_interval``; ``every_s`` below the floor is kept as is) and hands ``emit`` one
    ``system`` event ``{"type": "system", "t": run clock, "node": ..., "values":
    {system/<process>/<quantity>: x}}`` (docs/spans.md). ``pids`` and ``extra`` are called on this
    thread: they must only read."""

    def __init__(self, every_s: float, now: Callable[[], float], pids: Callable[[], dict[str, int]],
                 emit: Callable[[dict], None], extra: Callable[[], dict[str, float]] = dict):
        self.every_s, self.now, self.pids, self.emit, self.extra = every_s, now, pids, emit, extra
        self.node = node_name()
        self.samples = 0
        self._sampler = ProcessSampler()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="system-sampler", daemon=True)

    def start(self) -> "SystemSampler":
        self._sampler.sample(self.pids())  # the first event's CPU % is over its first interval
        self._thread.start()
        return self

    def _loop(self) -> None:
        started = time.monotonic()
        while not self._stop.wait(sample_interval(time.monotonic() - started, self.every_s)):
            try:
                values = {**self._sampler.sample(self.pids()), **self.extra()}
            except Exception:  # a process table read racing a worker's restart: skip this sample
                continue
            if values:
                self.emit({"type": "system", "t": round(self.now(), 6), "node": self.node, "values": values})
                self.samples += 1

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
