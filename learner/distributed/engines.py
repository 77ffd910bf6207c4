"""One gradient reduction, clipping of the reduced gradient, one optimizer step (docs/distributed.md).

When ``reduce()`` is called every rank's ``p.grad`` holds its own share of the batch gradient,
already multiplied by the batch normaliser of the *whole* batch (the barrier's counts), so the
batch gradient is the plain sum over ranks: no 1/W anywhere.

``TorchDataParallel`` (``learner.engine: torch``): all-reduces (sum) of the gradients in place, in
buckets of at most ``REDUCE_BUCKET_BYTES``, over torch.distributed, in the model's dtype (float64
too), then ``clip_grad_norm_`` and the optimizer.

``DeepSpeedEngine`` (``learner.engine: deepspeed``, ZeRO stage 0/1/2, optional optimizer offload):
streaming stays outside DeepSpeed. Its ZeRO-1/2 reduction hooks fire only on its own backward, and
a plain ``.backward()`` per trajectory under ZeRO-2 would start a collective per call (ranks with
different numbers of trajectories would deadlock), so the rank's gradient is handed over once per
batch through DeepSpeed's public path: a stand-in loss Σ_p ⟨p, g_p⟩ with g_p detached, whose
gradient is exactly g_p, ``engine.backward`` with ``gradient_allreduce_op: sum``, then
``engine.step()`` (DeepSpeed clips the reduced gradient: ``gradient_clipping``). float32 only:
DeepSpeed has no float64 path (use the torch engine); ZeRO-3 is not offered (its parameters are
partitioned and gathered only inside the engine's own forward, which the learner does not run).
"""

from __future__ import annotations

import logging

import torch
import torch.distributed as dist

from learner.distributed.barrier_vote import named_collective
from learner.grad.learners.common import clip_and_step
from learner.registries.engines import learner_engine

ZERO_STAGES = (0, 1, 2)


def _world() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


REDUCE_BUCKET_BYTES = 64 * 2**20  # the torch engine's reduction: most extra memory it holds at once


def buckets(grads: list[torch.Tensor], bucket_bytes: int) -> list[list[torch.Tensor]]:
    """Consecutive gradients in groups of at most ``bucket_bytes`` (a larger one alone, reduced
    in place without a copy), each group of one dtype and device."""
    out: list[list[torch.Tensor]] = []
    size = 0
    for g in grads:
        nbytes = g.numel() * g.element_size()
        last = out[-1] if out else None
        if last and size + nbytes <= bucket_bytes and (g.dtype, g.device) == (last[0].dtype, last[0].device):
            last.append(g)
            size += nbytes
        else:
            out.append([g])
            size = nbytes
    return out


class TorchDataParallel:
    name = "torch"
    zero_stage = None

    def __init__(self, params: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer, grad_clip: float,
                 bucket_bytes: int = REDUCE_BUCKET_BYTES):
        self.params, self.optimizer, self.grad_clip = params, optimizer, grad_clip
        self.bucket_bytes = bucket_bytes

    def reduce(self) -> None:
        """Sum every rank's p.grad in place, bucket by bucket: a gradient of at least a bucket is
        all-reduced as it is; smaller ones are packed into one flat buffer of at most
        ``bucket_bytes``, all-reduced, and copied back. Extra memory: one bucket (the sums are
        element-wise, so bucketing changes no value on two ranks)."""
        for p in self.params:
            if p.grad is None:  # a parameter no loss touched on this rank: its share is 0
                p.grad = torch.zeros_like(p)
            elif not p.grad.is_contiguous():
                p.grad = p.grad.contiguous()
        if _world() <= 1:
            return
        with named_collective("the gradient all-reduce"):
            self._reduce_buckets()

    def _reduce_buckets(self) -> None:
        for group in buckets([p.grad for p in self.params], self.bucket_bytes):
            if len(group) == 1:
                dist.all_reduce(group[0], op=dist.ReduceOp.SUM)
                continue
            flat = torch.cat([g.reshape(-1) for g in group])
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            at = 0
            for g in group:
                g.copy_(flat[at:at + g.numel()].view_as(g))
                at += g.numel()
            del flat

    def reduced_grads(self) -> list[torch.Tensor]:
        return [p.grad.detach().clone() for p in self.params]

    def step(self) -> float:
        """Clip the reduced gradient (the same on every rank), one step; returns its norm before clipping."""
        return clip_and_step(self.params, self.optimizer, self.grad_clip)


class DeepSpeedEngine:
    name = "deepspeed"

    def __init__(self, model: torch.nn.Module, params: list[torch.nn.Parameter], lr: float, weight_decay: float,
                 grad_clip: float, zero_stage: int, offload: bool = False):
        if zero_stage not in ZERO_STAGES:
            raise ValueError(f"learner.zero_stage: {zero_stage} is not one of 0, 1, 2 (ZeRO-3 partitions the "
                             "parameters inside DeepSpeed's own forward, which the streaming learner does not run)")
        if offload and zero_stage == 0:
            raise ValueError("learner.offload_optimizer: optimizer offload needs learner.zero_stage 1 or 2")
        bad = sorted({str(p.dtype).removeprefix("torch.") for p in params if p.dtype != torch.float32})
        if bad:
            raise ValueError(f"model.dtype: learner.engine deepspeed trains float32 here, got {', '.join(bad)} "
                             "(float64 runs on learner.engine torch)")
        import deepspeed
        import deepspeed.ops
        from deepspeed.utils import logger as ds_logger

        # DeepSpeed's shared-memory comm op serves only its inference all-reduce; the training
        # reduction here runs over torch.distributed (gloo). Without this it JIT-compiles C++ at
        # start-up (minutes on a loaded 2-core machine, and again whenever its build hash moves).
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False

        ds_logger.setLevel(logging.WARNING)
        zero: dict = {"stage": zero_stage}
        if offload:
            zero["offload_optimizer"] = {"device": "cpu"}
        config = {
            "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "train_batch_size": _world(),
            "gradient_allreduce_op": "sum", "gradient_clipping": float(grad_clip), "zero_optimization": zero,
            "zero_allow_untested_optimizer": True, "zero_force_ds_cpu_optimizer": False,
            "steps_per_print": 2**31 - 1, "wall_clock_breakdown": False,
        }
        optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
        self.engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config,
                                                    dist_init_required=False)
        self.params, self.zero_stage, self.offload = params, zero_stage, offload
        self._safe_get_full_grad = deepspeed.utils.safe_get_full_grad

    def reduce(self) -> None:
        """Hand the rank's gradient to DeepSpeed: backward of the stand-in loss Σ_p ⟨p, g_p⟩."""
        grads = []
        for p in self.params:
            grads.append(p.grad.detach() if p.grad is not None else torch.zeros_like(p))
            p.grad = None  # DeepSpeed's stage 0 accumulates into p.grad: start from nothing
        stand_in = torch.stack([(p * g).sum() for p, g in zip(self.params, grads)]).sum()
        self.engine.backward(stand_in)

    def reduced_grads(self) -> list[torch.Tensor]:
        """The full reduced gradient (ZeRO-1/2: gathered from the partitions; a collective)."""
        return [self._safe_get_full_grad(p).detach().clone() for p in self.params]

    def step(self) -> float:
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        return float(norm) if norm is not None else float("nan")


def broadcast_optimizer_state(engine: "TorchDataParallel | DeepSpeedEngine") -> None:
    """Every rank's torch optimizer starts from rank 0's state (a resumed run's moments and step
    counts, loaded from its checkpoint on rank 0; empty for a fresh run). A collective: every
    rank calls it once after building its engine. DeepSpeed keeps its own state (not resumed)."""
    if not learner_engine(engine.name).checkpoints_optimizer or _world() <= 1:
        return
    box = [engine.optimizer.state_dict() if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    if dist.get_rank() != 0:
        engine.optimizer.load_state_dict(box[0])


def make_learner_engine(kind: str, model: torch.nn.Module, lr: float, weight_decay: float, grad_clip: float,
                zero_stage: int = 0, offload: bool = False,
                optimizer: torch.optim.Optimizer | None = None) -> "TorchDataParallel | DeepSpeedEngine":
    """``optimizer``: the torch engine steps this one (rank 0's, which checkpoints save and load)."""
    params = [p for p in model.parameters() if p.requires_grad]
    learner_engine(kind)  # a KeyError naming learner.engine and the known engines
    if kind == TorchDataParallel.name:
        return TorchDataParallel(params, optimizer or torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay), grad_clip)
    return DeepSpeedEngine(model, params, lr, weight_decay, grad_clip, zero_stage, offload)
