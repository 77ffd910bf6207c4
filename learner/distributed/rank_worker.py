"""Learner ranks 1..W−1 of a run: each loads the policy, streams the groups it owns and joins the
barrier and the reduction; rank 0 (the driver) publishes (docs/distributed.md).

Rank 0 sends, in order, per batch: ``("begin", {group: size})``, ``("learn", items)`` (only this
rank's groups), ``("finish",)``; ``("publish", version)`` to a rank that hosts its node's
rollout workers (``learner.distributed.node_rollouts``); and ``("stop",)`` at the end. This rank answers on the shared
up-queue with ``("phase", rank, kind, t0, t1, traj, group)`` for each backward / group close (raw
``time.monotonic()``, the same clock in every process of the node), ``("logprobs", rank, batch,
{traj: float64 array | None})`` after its barrier (its trajectories' log-probs for the mismatch
metric, ``RankLearner.own_logprobs``), then ``("stepped", rank, stats)`` after its optimizer step, or ``("error", rank, message)`` before it exits.
"""

from __future__ import annotations

import multiprocessing
import queue
import time

from learner.timeline import Kind

WAIT_SLICE_S = 0.05  # how long an idle rank blocks before looking for idle work again


def build_rank(cfg, policy_dir: str, rank: int, world: int):
    """(RankLearner, engine) over this process's own copy of the policy."""
    import torch

    from learner.distributed.engines import broadcast_optimizer_state, make_learner_engine
    from learner.distributed.rank import RankLearner
    from learner.grad.learners.common import LearnerOptions
    from learner.grad.learners.on_policy import StreamingLearner
    from learner.placement import learner_device
    from learner.models.loading import load_model

    torch.manual_seed(cfg.seed)
    dtype, device = getattr(torch, cfg.model.dtype), torch.device(learner_device(cfg, rank))
    model = load_model(policy_dir, dtype).to(device).train()
    ref = None
    if cfg.algorithm.kl_coef > 0:
        ref = load_model(policy_dir, dtype).to(device)
        ref.requires_grad_(False)
    learner = StreamingLearner(model, cfg.algorithm, ref, LearnerOptions.from_config(cfg))
    lrn, train = cfg.learner, cfg.train
    engine = make_learner_engine(lrn.engine, model, train.lr, train.weight_decay, train.grad_clip,
                         lrn.zero_stage, lrn.offload_optimizer)
    broadcast_from_rank0(model)
    broadcast_optimizer_state(engine)
    return RankLearner(learner, rank, world), engine


def broadcast_from_rank0(model) -> None:
    """Every rank starts from rank 0's weights (they load the same files; this makes it a fact)."""
    import torch.distributed as dist

    from learner.distributed.barrier_vote import named_collective

    if dist.is_initialized() and dist.get_world_size() > 1:
        with named_collective("the weight broadcast from rank 0"):
            for p in model.parameters():
                dist.broadcast(p.data, src=0)


def param_digest(model) -> str:
    """SHA-256 of every parameter's bytes: equal on all ranks iff their weights are bit-identical.
    Copies every parameter to the host: seconds per step at 1B parameters (docs/gpu.md), so ranks
    run it every ``learner.digest_every`` steps and ``param_checksum`` on the others."""
    import hashlib

    import torch

    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


_INT_VIEW = {1: "int8", 2: "int16", 4: "int32", 8: "int64"}
CHECKSUM_WIDTH = 4096  # a tensor's bits are summed as a (rows, CHECKSUM_WIDTH) matrix
_columns: dict = {}  # device -> arange(1, CHECKSUM_WIDTH + 1) int64, made once


def param_checksum(model) -> str:
    """A cheap on-device fingerprint of every parameter's bits. Per tensor, its bit patterns as
    integers (int32 for float32, int16 for bf16, ...) laid out as a (rows, W) matrix, reduced with
    an int64 accumulator (no widened copy): the plain sum, Σ_r (r + 1)·rowsum_r and
    Σ_c (c + 1)·colsum_c, modulo 2^64 (integer addition wraps and is associative: the result
    does not depend on the reduction order, the kernel or the device). One changed element
    changes the plain sum; two elements swapped change the row- or the column-weighted sum.
    One host transfer of 24 bytes per tensor. Equal on every rank when their weights are
    bit-identical; a difference is certain divergence; equality is checked in full by
    ``param_digest`` every ``learner.digest_every`` steps."""
    import hashlib

    import torch

    sums = []
    for p in model.parameters():
        bits = p.detach().reshape(-1).view(getattr(torch, _INT_VIEW[p.element_size()]))
        device = bits.device
        cols = _columns.get(device)
        if cols is None:
            cols = _columns[device] = torch.arange(1, CHECKSUM_WIDTH + 1, dtype=torch.int64, device=device)
        rows, tail = divmod(bits.numel(), CHECKSUM_WIDTH)
        main = bits[:rows * CHECKSUM_WIDTH].view(rows, CHECKSUM_WIDTH)
        row_sums = main.sum(dim=1, dtype=torch.int64)  # (rows,)
        col_sums = main.sum(dim=0, dtype=torch.int64)  # (W,)
        rest = bits[rows * CHECKSUM_WIDTH:].to(torch.int64)  # < W elements: the last, partial row
        row_w = torch.arange(1, rows + 1, dtype=torch.int64, device=device)
        plain = row_sums.sum() + rest.sum()
        by_row = (row_sums * row_w).sum() + rest.sum() * (rows + 1)
        by_col = (col_sums * cols).sum() + (rest * cols[:tail]).sum()
        sums.append(torch.stack([plain, by_row, by_col]))
    host = torch.stack(sums).cpu() if sums else torch.zeros((0, 3), dtype=torch.int64)
    return "sum:" + hashlib.sha256(host.numpy().tobytes()).hexdigest()[:32]


def weights_fingerprint(model, batch: int, digest_every: int) -> str:
    """What ranks compare after the step of their ``batch``-th barrier (1, 2, ...): the full
    ``param_digest`` on the first and every ``digest_every``-th, ``param_checksum`` between."""
    if batch <= 1 or (batch - 1) % digest_every == 0:
        return param_digest(model)
    return param_checksum(model)


def rank_main(cfg_dict: dict, policy_dir: str, rank: int, world: int, init_method: str, cmd_q, up_q,
              rollouts=None) -> str | None:
    """Entry point of a rank process (spawned beside rank 0, or ``thundersync join-rank`` on
    another node); returns its error, which it has also reported to rank 0. ``rollouts``: the
    node's rollout workers this rank hosts (``learner.distributed.node_rollouts``), or None."""
    from learner.config import RunConfig
    from learner.distributed.ranks import init_rank

    cfg = RunConfig.model_validate(cfg_dict)
    try:
        import os

        os.sched_setaffinity(0, range(os.cpu_count() or 1))  # not rank 0's pinned core, which it inherited
        from learner.distributed.barrier_vote import collectives_raise_on_timeout
        from learner.placement import learner_device, local_rank

        collectives_raise_on_timeout()  # NCCL: a stuck collective raises, naming this rank
        local, local_world = local_rank(cfg, rank)  # torchrun's LOCAL_RANK: the index among its node's ranks
        init_rank(rank, world, init_method, cfg.learner.timeout_s, local_rank=local, device=learner_device(cfg, rank),
                  local_world_size=local_world)
        rl, engine = build_rank(cfg, policy_dir, rank, world)
        if rollouts is not None:
            rollouts.attach(rl.learner.model)
        _serve(rl, engine, rank, cmd_q, up_q, rollouts, cfg.learner.digest_every)
        return None
    except BaseException as exc:  # rank 0 reports it and stops the run
        error = f"{type(exc).__name__}: {exc}".splitlines()[0]
        up_q.put(("error", rank, error))
        return error
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def _serve(rl, engine, rank: int, cmd_q, up_q, rollouts, digest_every: int) -> None:
    def on_phase(kind, t0, t1, traj, group) -> None:
        up_q.put(("phase", rank, kind, t0, t1, traj, group))

    parent = multiprocessing.parent_process()
    in_batch, batches = False, 0
    while True:
        try:
            msg = cmd_q.get(timeout=WAIT_SLICE_S)
        except queue.Empty:
            if in_batch and rl.idle_work(on_phase):
                continue
            if parent is not None and not parent.is_alive():  # rank 0 is gone: nobody will stop us
                raise RuntimeError(f"rank {rank}: rank 0 (the driver) exited")
            continue
        if msg[0] == "begin":
            rl.begin_batch(msg[1])
            in_batch = True
        elif msg[0] == "learn":
            rl.learn(msg[1], on_phase)
        elif msg[0] == "finish":
            in_batch = False
            stats = rl.finish_batch()
            t0 = time.monotonic()
            batches += 1  # this rank's log-probs for rank 0's mismatch metric, before the weights move
            up_q.put(("logprobs", rank, batches, rl.own_logprobs()))
            engine.reduce()
            stats["grad_norm"] = engine.step()
            stats["param_digest"] = weights_fingerprint(rl.learner.model, batches, digest_every)
            on_phase(Kind.OPTIMIZER, t0, time.monotonic(), None, None)
            up_q.put(("stepped", rank, stats))
        elif msg[0] == "publish":  # ("publish", version): between steps, as rank 0's
            rollouts.publish(msg[1])
        elif msg[0] == "stop":
            return
        else:
            raise RuntimeError(f"rank {rank}: unknown command {msg[0]!r}")
