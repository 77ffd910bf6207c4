"""Rollout engines and learner engines as entries: what the rest of the code needs to know
about each (how its processes are counted, what it supports). The constructors live with the
engines (``learner.rollout.engine.factory``, ``learner.distributed.engines``), keyed by these
names; a new engine (SGLang, say) adds an entry here and a builder there."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RolloutEngineKind:
    name: str
    summary: str
    # the config field that counts its processes: one worker per engine (torch) or one
    # replica serving many agent loops (vllm)
    processes_field: str
    # the torch engine's own features: continuous batching, captured decode, a row cap
    in_process_batching: bool
    # chooses its GPU itself (placement only records what it reports)
    places_itself: bool
    # speculation's drafts need a per-engine preflight (vLLM's own checks)
    speculation_preflight: bool = False


@dataclass(frozen=True)
class LearnerEngineKind:
    name: str
    summary: str
    # the learner runs in the driver's process as plain torch (LoRA, off-policy schedules,
    # the deterministic path and the adaptive drain live there); otherwise it runs as ranks
    in_process: bool
    # model dtypes it trains
    dtypes: tuple[str, ...] = ("float32", "float64", "bfloat16")
    # may keep the optimizer state in host memory (learner.offload_optimizer)
    offloads_optimizer: bool = False
    # its optimizer state is the learner's own, so checkpoints hold it (ZeRO partitions it)
    checkpoints_optimizer: bool = True


ROLLOUT_ENGINES: dict[str, RolloutEngineKind] = {}
LEARNER_ENGINES: dict[str, LearnerEngineKind] = {}


def rollout_engine(name: str) -> RolloutEngineKind:
    try:
        return ROLLOUT_ENGINES[name]
    except KeyError:
        raise KeyError(f"rollout.engine: {name!r} is not one of {', '.join(ROLLOUT_ENGINES)}") from None


def learner_engine(name: str) -> LearnerEngineKind:
    try:
        return LEARNER_ENGINES[name]
    except KeyError:
        raise KeyError(f"learner.engine: {name!r} is not one of {', '.join(LEARNER_ENGINES)}") from None


for _kind in (RolloutEngineKind("torch", "the project's own torch sampler: keyed sampling, continuous batching",
                                "rollout.workers", True, False),
              RolloutEngineKind("vllm", "vLLM replicas: paged KV cache, the same keyed sampling", "rollout.replicas",
                                False, True, speculation_preflight=True)):
    ROLLOUT_ENGINES[_kind.name] = _kind
for _learner in (LearnerEngineKind("torch", "plain torch in the driver's process (W ranks with world_size > 1)", True),
                 LearnerEngineKind("deepspeed", "DeepSpeed ZeRO 0/1/2 ranks", False, dtypes=("float32",),
                                   offloads_optimizer=True, checkpoints_optimizer=False)):
    LEARNER_ENGINES[_learner.name] = _learner
ROLLOUT_ENGINE_NAMES: tuple[str, ...] = tuple(ROLLOUT_ENGINES)
LEARNER_ENGINE_NAMES: tuple[str, ...] = tuple(LEARNER_ENGINES)


def process_count(rollout: dict | object) -> int:
    """How many rollout processes a config's rollout section starts (workers or replicas)."""
    get = rollout.get if isinstance(rollout, dict) else lambda key: getattr(rollout, key)
    return int(get(rollout_engine(get("engine")).processes_field.split(".", 1)[1]))
