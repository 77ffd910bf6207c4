"""Start rollout worker processes before the driver has imported torch.

A worker spends most of its start-up importing torch and transformers (~7 s on a 2-core
VM), and so does the driver. Spawned only once the driver has its model (the old order),
the worker imported after the driver, and every run started ~7 s later than it had to.
``boot_workers`` spawns the workers first, from a module that needs only the standard
library, so both processes import side by side on their own cores; each worker then waits
for its ``Init`` command (config, model directories, the shared weight tensors,
the run clock's origin), which ``Fleet`` sends once the driver has built its weight store.

The weight store's two version counters (``multiprocessing.Value``) can only reach a child
by inheritance, so they are made here and passed at spawn; the weight tensors, made later,
travel in the init command through torch's shared-memory pickling.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import signal
import traceback
from dataclasses import dataclass, field
from typing import Any

from learner.rollout.processes.cores import core_plan, pin_process
from learner.rollout.processes.messages import Failed, Init, Stop
from learner.rollout.processes.outbox import Outbox
from learner.registries.engines import process_count

PR_SET_PDEATHSIG = 1
# "spawn": a fresh interpreter imports beside the driver (above). A run forked from the warm
# runner (learner/warm/server.py) has everything imported already and forks its workers at
# boot, before it starts any thread; a worker respawned mid-run is always spawned (forking a
# driver whose threads may hold locks is not safe).
START_METHOD = "spawn"


def worker_start_method(cfg) -> str:
    """How this run's workers start: ``START_METHOD``, except a run on a GPU always spawns them.
    CUDA cannot be used in a child forked after its parent initialised the CUDA driver, and a
    CUDA run's driver has by boot (``torch.cuda.is_available`` in the pre-flight checks); its
    workers import torch afresh (docs/gpu.md, "CUDA and fork")."""
    return "spawn" if cfg.model.device == "cuda" else START_METHOD


def die_with_parent() -> None:
    """Ctrl-C reaches the whole foreground group: the driver decides when workers stop
    (learner/stopping.py), so a worker ignores SIGINT; and a driver killed with SIGKILL
    takes its workers with it instead of leaving them blocked on their command queue."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return  # not Linux: workers still stop on Stop() or when the driver terminates them
    parent = mp.parent_process()
    if parent is not None and os.getppid() != parent.pid:  # the driver died before the request took effect
        os._exit(1)


@dataclass
class BootedWorkers:
    """Worker processes that are importing or waiting for their init command. ``conns``: the
    driver's reading end of each worker's own pipe (``learner.rollout.processes.outbox``)."""

    conns: list[Any]
    cmd_qs: list[Any]
    counters: tuple[Any, Any]  # (version, writing) of the weight store they will read
    cores: list[int | None] = field(default_factory=list)
    procs: list[Any] = field(default_factory=list)
    taken: bool = False  # a Fleet owns them now and stops them
    first_wid: int = 0  # worker ids are global over the run's nodes: this node's start here

    def close(self) -> None:
        """Stop workers no Fleet took over (the driver failed before it built its fleet)."""
        if self.taken:
            return
        # a worker still importing has nothing worth waiting for
        stop_workers(self.cmd_qs, self.procs, grace_s=2.0)
        self.taken = True

    def respawn(self, wid: int) -> None:
        """A new process in worker ``wid``'s place (its core; a new pipe and command queue):
        the old one died. The dead worker's queue is dropped without waiting for its feeder."""
        self.conns[wid].close()
        self.cmd_qs[wid].cancel_join_thread()
        self.cmd_qs[wid].close()
        self.procs[wid], self.cmd_qs[wid], self.conns[wid] = spawn_worker(self.first_wid + wid, self.cores[wid],
                                                                          self.counters)


def stop_workers(cmd_qs: list[Any], procs: list[Any], grace_s: float) -> None:
    """Ask every worker to stop; terminate those still alive after ``grace_s``."""
    for q in cmd_qs:
        q.put(Stop())  # a worker reading its commands exits on it
    for p in procs:
        p.join(timeout=grace_s)
        if p.is_alive():
            p.terminate()
            p.join(timeout=10)
    for q, p in zip(cmd_qs, procs):
        if not p.is_alive():  # nobody reads its queue any more: exit must not wait on its feeder thread
            q.cancel_join_thread()


def workers_per_node(cfg) -> int:
    """Rollout workers of one node: one per torch worker, or per vLLM replica (each owns one engine)."""
    return process_count(cfg.rollout)


def boot_fleet(cfg, first_wid: int = 0) -> BootedWorkers:
    """The workers of run config ``cfg`` on this node, on the cores ``core_plan`` gives them;
    ``first_wid``: the id of this node's first worker (docs/distributed-nodes.md, "Rollouts on every node")."""
    return boot_workers(core_plan(workers_per_node(cfg), cfg.rollout.pin_cores)[1], first_wid,
                        worker_start_method(cfg))


def boot_workers(cores: list[int | None], first_wid: int = 0, method: str | None = None) -> BootedWorkers:
    """Start one worker process per entry of ``cores`` (its core, or None), by ``method``
    (None: ``START_METHOD``)."""
    ctx = mp.get_context("spawn")
    booted = BootedWorkers(conns=[], cmd_qs=[], counters=(ctx.Value("q", 0), ctx.Value("q", 0)), cores=list(cores),
                           first_wid=first_wid)
    for w, core in enumerate(cores):
        proc, cmd_q, conn = spawn_worker(first_wid + w, core, booted.counters, method or START_METHOD)
        booted.procs.append(proc)
        booted.cmd_qs.append(cmd_q)
        booted.conns.append(conn)
    return booted


def spawn_worker(wid: int, core: int | None, counters, method: str = "spawn") -> tuple[Any, Any, Any]:
    """Worker ``wid``'s process, its command queue and the reading end of its pipe. The
    counters are always spawn-context values: a forked child inherits them just as well."""
    ctx = mp.get_context(method)
    cmd_q = ctx.Queue()
    receive, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=worker_entry, daemon=True, name=f"rollout-{wid}", args=(wid, core, cmd_q, send, counters))
    proc.start()
    send.close()  # the worker holds the only writing end: its death reads as end-of-file here
    return proc, cmd_q, receive


def worker_entry(wid: int, core: int | None, cmd_q, conn, counters) -> None:
    """A worker process: import (beside the driver), wait for init, then serve."""
    out_q = Outbox(conn)
    try:
        die_with_parent()
        pin_process(core)
        from learner.rollout.processes.weights import WeightStore
        from learner.rollout.processes.agent_worker import worker_main

        cmd = cmd_q.get()
        if not isinstance(cmd, Init):
            return  # Stop: the driver gave up before it had a model
        store = WeightStore.attach(cmd.tensors, *counters)
    except Exception as exc:  # the driver turns this into a failed run with this text
        out_q.put(Failed(wid, f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=6)}"))
        out_q.flush(timeout_s=10.0)
        return
    worker_main(wid, cmd.cfg_json, cmd.policy_dir, cmd.teacher_dir, store, cmd_q, out_q, cmd.origin, core)
