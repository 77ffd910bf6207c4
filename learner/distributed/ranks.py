"""Rank processes: a free port, the c10d rendezvous, spawning W ranks with every wait bounded.

On one node the ranks rendezvous at ``tcp://127.0.0.1:<free port>`` (a TCP store held by rank
0); across nodes the same ``init_method`` names rank 0's host. The process group (gloo; with
NCCL beside it for ranks on GPUs) carries the collective timeout, so an all-reduce whose peer died raises instead of hanging. On CPU each
rank runs one torch thread. torch is imported inside the functions that need it: the controller
imports ``free_port`` (learner.nodes) without it.
"""

from __future__ import annotations

import os
import queue
import socket
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta


DEFAULT_TIMEOUT_S = 120.0


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now (the rendezvous and control ports rank 0's node picks)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class RankFailure(RuntimeError):
    """One or more rank processes failed, died or ran past the timeout (all were stopped)."""


def process_group_backend(device: str) -> str:
    """gloo for ranks on CPU; for ranks each on its own GPU ("cuda:<i>", learner.placement), NCCL
    for CUDA tensors (the gradient reduction, the weight broadcast) and gloo for the CPU tensors
    the barrier exchanges (one group, both backends). Ranks on plain "cuda" all share the node's
    first GPU, which NCCL refuses (one rank per GPU): gloo, as before placement existed."""
    return "cpu:gloo,cuda:nccl" if device.startswith("cuda:") else "gloo"


@dataclass(frozen=True)
class RankEnv:
    """What torchrun gives a rank: its global ``rank``, its index among the ranks on its own node
    (``local_rank``), the counts, its node and the rendezvous address (rank 0's node)."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node: str
    master_addr: str
    master_port: int

    def environ(self) -> dict[str, str]:
        """The environment variables torchrun sets (DeepSpeed reads LOCAL_RANK for its device)."""
        return {"RANK": str(self.rank), "LOCAL_RANK": str(self.local_rank), "WORLD_SIZE": str(self.world_size),
                "LOCAL_WORLD_SIZE": str(self.local_world_size), "MASTER_ADDR": self.master_addr,
                "MASTER_PORT": str(self.master_port)}


def rank_layout(nodes: list[str], master_addr: str, master_port: int) -> list[RankEnv]:
    """torchrun's semantics from a placement: ``nodes[r]`` is the node rank ``r`` runs on. A rank's
    local rank is its index among the ranks of its node in rank order (rank 4, the first rank of
    the second node of a 2 x 4 run, is local rank 0: its node's first GPU, not GPU 4)."""
    seen: dict[str, int] = {}
    local = []
    for node in nodes:
        local.append(seen.get(node, 0))
        seen[node] = local[-1] + 1
    return [RankEnv(r, local[r], len(nodes), seen[node], node, master_addr, master_port)
            for r, node in enumerate(nodes)]


def init_rank(rank: int, world_size: int, init_method: str, timeout_s: float = DEFAULT_TIMEOUT_S,
              local_rank: int | None = None, device: str = "cpu", local_world_size: int | None = None) -> None:
    """Join the process group (``process_group_backend(device)``; the rendezvous waits at most
    ``timeout_s``; so does every collective). ``device``: the rank's own (learner.placement).
    ``local_rank``/``local_world_size``: the rank's index among its node's ranks and their count
    (None: every rank on this node, so the global rank and the world size)."""
    import torch
    import torch.distributed as dist

    from learner.placement import bind_device

    bind_device(device)  # NCCL binds a rank to the current device
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if device.startswith("cuda") else "cpu")  # DeepSpeed's
    # what a launcher (torchrun) would set; DeepSpeed reads them
    host, _, port = init_method.removeprefix("tcp://").rpartition(":")
    env = RankEnv(rank, rank if local_rank is None else local_rank, world_size,
                  world_size if local_world_size is None else local_world_size, "", host, int(port or 0))
    os.environ.update(env.environ())
    torch.set_num_threads(1)
    dist.init_process_group(process_group_backend(device), init_method=init_method, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=timeout_s))


def _rank_entry(target: Callable, rank: int, world_size: int, init_method: str, timeout_s: float,
                args: tuple, results) -> None:
    import torch.distributed as dist

    try:
        init_rank(rank, world_size, init_method, timeout_s)
        results.put(("ok", rank, target(rank, world_size, *args)))
    except BaseException as exc:  # reported to the parent, which stops every rank
        last = traceback.format_exc().strip().splitlines()[-1]
        results.put(("error", rank, f"{type(exc).__name__}: {exc}".splitlines()[0] or last))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def spawn_ranks(target: Callable, world_size: int, args: tuple = (), timeout_s: float = DEFAULT_TIMEOUT_S,
                collective_timeout_s: float | None = None) -> list:
    """Run ``target(rank, world_size, *args)`` in ``world_size`` spawned processes joined in one
    gloo group; returns each rank's result (rank order). Waits at most ``timeout_s`` in all; on
    any failure every rank still running is terminated, then killed, and ``RankFailure`` names
    each failed rank and its error."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    init_method = f"tcp://127.0.0.1:{free_port()}"
    coll = collective_timeout_s if collective_timeout_s is not None else timeout_s
    procs = [ctx.Process(target=_rank_entry, args=(target, r, world_size, init_method, coll, args, results),
                         daemon=True, name=f"thundersync-rank-{r}") for r in range(world_size)]
    for p in procs:
        p.start()
    got: dict[int, tuple[str, object]] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(got) < world_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RankFailure(f"ranks {sorted(set(range(world_size)) - set(got))} did not finish within "
                                  f"{timeout_s:g} s")
            try:
                status, rank, value = results.get(timeout=min(remaining, 1.0))
                got[rank] = (status, value)
            except queue.Empty:
                dead = [r for r, p in enumerate(procs) if r not in got and p.exitcode is not None]
                if dead:  # died without a word (killed, segfault): its peers would wait for it
                    raise RankFailure(f"rank {dead[0]} exited with code {procs[dead[0]].exitcode} and no result")
    finally:
        stop_processes(procs, max(1.0, min(10.0, deadline - time.monotonic())))
        results.close()
        results.join_thread()
    errors = {r: v for r, (s, v) in got.items() if s == "error"}
    if errors:
        raise RankFailure("; ".join(f"rank {r}: {v}" for r, v in sorted(errors.items())))
    return [got[r][1] for r in range(world_size)]


def stop_processes(procs: list, grace_s: float) -> None:
    """Join every rank; terminate, then kill, whichever is still running after ``grace_s``."""
    end = time.monotonic() + grace_s
    for p in procs:
        p.join(max(0.0, end - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.terminate()
            p.join(5.0)
        if p.is_alive():
            p.kill()
            p.join(5.0)
