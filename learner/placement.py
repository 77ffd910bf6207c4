"""Which GPU each process of a run uses: the ``placement`` section, its checks, the process -> device map.

    placement:
      learner: [0, 1, 2, 3]   # one GPU per learner rank of each node (rank r: local rank r % per node)
      rollout: [4, 5, 6, 7]   # the GPUs of each node's rollout workers, workers_per_gpu on each
      workers_per_gpu: 1
      teacher: null           # the OPD teacher's GPU in each rollout worker (null: the worker's own)
      colocated: false        # a GPU in both learner and rollout lists only when true

Without the section every process uses ``model.device`` (as before: "cuda" is the node's first
GPU). With it ``model.device`` must be cuda; the schema checks the lists against each other and
the run's shape (``placement_problem``), and ``check_visible`` checks them against the GPUs torch
sees on the node, before any process starts. A process is given an explicit ``torch.device``
("cuda:4"), not ``CUDA_VISIBLE_DEVICES``: a rollout worker may hold the engine and the teacher on
two GPUs. docs/gpu.md, "Placing a run on a GPU node".

Nothing here imports torch or the run config (learner.config imports this module).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from learner.registries.objectives import objective as objective_of
from learner.registries.engines import process_count, rollout_engine

class PlacementConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    learner: list[int] = Field(..., min_length=1, max_length=64,
                               description="GPU index of each learner rank on a node, in rank order")
    rollout: list[int] = Field(..., min_length=1, max_length=64,
                               description="GPU indices of a node's rollout workers (one engine replica per GPU, "
                                           "workers_per_gpu workers on each)")
    workers_per_gpu: int = Field(1, ge=1, le=64, description="rollout workers (engines) sharing each rollout GPU")
    teacher: int | None = Field(None, ge=0, le=1023,
                                description="OPD: the GPU the teacher runs on in every rollout worker "
                                            "(null: the worker's own GPU)")
    colocated: bool = Field(False, description="allow a GPU to be both a learner and a rollout GPU (one-GPU runs)")
    gpus_per_node: int | None = Field(None, ge=1, le=1024,
                                      description="GPUs of each node, checked before the run reaches it (null: "
                                                  "checked on the node against what torch sees)")


def placement_problem(p: PlacementConfig, ranks_per_node: int, workers_per_node: int, device: str,
                      uses_teacher: bool, engine: str = "torch") -> str | None:
    """The first way ``p`` does not fit the run, as "placement.<field>: reason", or None."""
    if device != "cuda":
        return f"placement: GPU placement needs model.device cuda, not {device}"
    if rollout_engine(engine).places_itself:  # a vLLM replica chooses its GPU; placing it would be a claim, not a fact
        return ("placement.rollout: places torch engines only; a vLLM replica runs on the first GPU vLLM sees "
                "(rollout.engine vllm: leave placement out)")
    for field, gpus in (("learner", p.learner), ("rollout", p.rollout)):
        if bad := [g for g in gpus if g < 0]:
            return f"placement.{field}: GPU indices are >= 0, got {bad[0]}"
        if len(set(gpus)) != len(gpus):
            twice = sorted({g for g in gpus if gpus.count(g) > 1})
            hint = "one GPU per rank" if field == "learner" else "say workers_per_gpu instead of repeating a GPU"
            return f"placement.{field}: GPU {twice[0]} listed twice ({hint})"
    if len(p.learner) != ranks_per_node:
        return (f"placement.learner: {len(p.learner)} GPUs for {ranks_per_node} learner rank(s) per node "
                "(learner.world_size / len(learner.nodes)): one GPU per rank")
    if len(p.rollout) * p.workers_per_gpu != workers_per_node:
        return (f"placement.rollout: {len(p.rollout)} GPUs x {p.workers_per_gpu} workers_per_gpu = "
                f"{len(p.rollout) * p.workers_per_gpu} rollout workers, but the run has {workers_per_node} per node "
                "(rollout.workers, or rollout.replicas with engine vllm)")
    shared = sorted(set(p.learner) & set(p.rollout))
    if shared and not p.colocated:
        return (f"placement.rollout: GPU {shared[0]} is also a learner GPU; set placement.colocated: true to share "
                "it (the learner and the engines then compete for it)")
    if p.teacher is not None:
        if not uses_teacher:
            return "placement.teacher: only algorithm.objective opd runs a teacher"
        if p.teacher in p.learner and not p.colocated:
            return (f"placement.teacher: GPU {p.teacher} is a learner GPU; set placement.colocated: true to share it")
    if p.gpus_per_node is not None:
        return missing_gpu(p, p.gpus_per_node, "placement.gpus_per_node")
    return None


def missing_gpu(p: PlacementConfig, count: int, source: str) -> str | None:
    """"placement.<field>: GPU i is not on the node ..." for the first index >= ``count``, or None."""
    for field, gpus in (("learner", p.learner), ("rollout", p.rollout),
                        ("teacher", [] if p.teacher is None else [p.teacher])):
        if over := [g for g in gpus if g >= count]:
            return (f"placement.{field}: GPU {over[0]} is not on the node ({source}: {count} GPU(s), "
                    f"indices 0-{count - 1})")
    return None


def check_visible(cfg: Any, device_count: int) -> None:
    """Raise ValueError naming the field when the placement asks for a GPU this node lacks
    (``device_count``: what ``torch.cuda.device_count()`` says here)."""
    if cfg.placement is not None and (problem := missing_gpu(cfg.placement, device_count, "torch sees")):
        raise ValueError(problem)


def _ranks_per_node(cfg: Any) -> int:
    return cfg.learner.world_size // len(cfg.learner.nodes or [None])


def local_rank(cfg: Any, rank: int) -> tuple[int, int]:
    """(local rank, ranks on the node) of learner rank ``rank``: torchrun's LOCAL_RANK and
    LOCAL_WORLD_SIZE (rank 4 of a 2 x 4 run is its node's rank 0)."""
    per_node = _ranks_per_node(cfg)
    return rank % per_node, per_node


def learner_device(cfg: Any, rank: int = 0) -> str:
    """The device learner rank ``rank`` trains on (its local rank's GPU on its node)."""
    if cfg.placement is None:
        return cfg.model.device
    return f"cuda:{cfg.placement.learner[rank % _ranks_per_node(cfg)]}"


def rollout_device(cfg: Any, wid: int) -> str:
    """The device of rollout worker ``wid`` (ids are global over the nodes; each node places its own)."""
    if cfg.placement is None:
        return cfg.model.device
    p = cfg.placement
    local = wid % (len(p.rollout) * p.workers_per_gpu)
    return f"cuda:{p.rollout[local // p.workers_per_gpu]}"  # consecutive workers share a GPU


def teacher_device(cfg: Any, wid: int) -> str:
    """Where rollout worker ``wid`` runs the OPD teacher."""
    if cfg.placement is None or cfg.placement.teacher is None:
        return rollout_device(cfg, wid)
    return f"cuda:{cfg.placement.teacher}"


def device_map(cfg: Any) -> dict[str, str]:
    """Lane prefix -> device for the first node's processes ("learner/<rank>", "rollout/<wid>",
    "teacher/<wid>" with an OPD teacher; another node's are the same map from its first rank and
    worker on): what the run log's "boot: devices" line names."""
    lanes = {f"learner/{r}": learner_device(cfg, r) for r in range(_ranks_per_node(cfg))}
    workers = process_count(cfg.rollout)
    for w in range(workers):
        lanes[f"rollout/{w}"] = rollout_device(cfg, w)
        if objective_of(cfg.algorithm.objective).teacher_scored:
            lanes[f"teacher/{w}"] = teacher_device(cfg, w)
    return lanes


def bind_device(device: str) -> None:
    """Make GPU ``device`` ("cuda:<i>") this process's current CUDA device: what NCCL, new streams
    and CUDA graphs use. Plain "cuda" and "cpu" leave the process as it is (GPU 0 is current)."""
    if device.startswith("cuda:"):
        import torch

        torch.cuda.set_device(torch.device(device))


def describe(lanes: dict[str, str]) -> str:
    """One line: "learner/0 cuda:0, rollout/0 cuda:4, ..."."""
    return ", ".join(f"{lane} {dev}" for lane, dev in lanes.items())
