"""Model set-up of a run: pin, load the policy (and reference), optimizer, learner, weight
store, and the rollout fleet that takes over the booted workers (docs/processes.md)."""

from __future__ import annotations

import gc
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from learner.config import ConfigError, RunConfig
from learner.driver import rules
from learner.distributed.front import DataParallelLearner, RankPhase, uses_ranks
from learner.distributed.placed_fleet import PlacedFleet
from learner.evaluation import Evaluator
from learner.grad.learners.deterministic import on_policy_learner
from learner.grad.learners.common import LearnerOptions, OptimizerStep
from learner.grad.learners.protocol import Learner
from learner.grad.learners.off_policy import OffPolicyLearner
from learner.lora import publish_view, with_lora
from learner.placement import bind_device, learner_device
from learner.rollout.processes.boot import BootedWorkers
from learner.tasks.chat import turn_stop_ids
from learner.rollout.processes.cores import core_plan
from learner.tasks.env import Environment
from learner.rollout.speculation.drafts import speculation_refused
from learner.tasks.registry import make_env
from learner.rollout.processes.fleet import Fleet
from learner.models.loading import load_model, load_tokenizer, resolve_model_dir
from learner.rollout.processes.weights import WeightStore
from learner.rollout.processes.agent_worker import pin_to_core
from learner.registries.objectives import objective as objective_of


@dataclass
class RunParts:
    """Everything the driver loop works with."""

    policy_dir: Path
    model: torch.nn.Module
    tokenizer: Any
    params: list[torch.nn.Parameter]
    optimizer: torch.optim.Optimizer
    learner: Learner
    env: Environment
    store: WeightStore
    fleet: Fleet | PlacedFleet  # PlacedFleet: rollouts on every node of the run
    evaluator: Evaluator | None  # train.eval_every: held-out evaluation after a publish

    def publish(self, version: int, weights=None) -> None:
        """``version`` into the weight store (the policy's weights, or ``weights``) and, for a fleet
        on several nodes, into theirs."""
        self.store.publish(publish_view(self.model) if weights is None else weights, version)
        if isinstance(self.fleet, PlacedFleet):  # each other node's store: docs/distributed-nodes.md
            self.fleet.published(version)

    def close(self) -> None:
        """Stop the rollout workers and the learner's processes (if it has any), whatever happens."""
        try:
            self.fleet.close()
        finally:
            self.learner.close()


def build_run(cfg: RunConfig, booted: BootedWorkers, origin: float, on_rank_phase: RankPhase,
              load_state: Callable[[torch.nn.Module, torch.optim.Optimizer], int] | None = None) -> RunParts:
    """Load the models, build the learner and the weight store, start the rollout fleet
    (``booted``: its workers, spawned by ``boot_fleet`` as early as possible, so they
    import torch beside us). ``on_rank_phase``: the phases of the other data-parallel ranks.
    ``load_state``: a resumed run's checkpoint into the model and the optimizer, before the
    weights are published; returns their policy version (learner/driver/resume.py)."""
    torch.manual_seed(cfg.seed)
    learner_core, _ = core_plan(len(booted.cmd_qs), cfg.rollout.pin_cores)
    if learner_core is not None:
        pin_to_core(learner_core)
    torch.set_num_threads(1)
    policy_dir = resolve_model_dir(cfg.model.policy, cfg.model.cache_dir, cfg.model.builtin_seed)
    teacher_dir = (resolve_model_dir(cfg.model.teacher, cfg.model.cache_dir, cfg.model.builtin_seed)
                   if objective_of(cfg.algorithm.objective).teacher_scored else None)
    dtype, device = getattr(torch, cfg.model.dtype), torch.device(learner_device(cfg, 0))  # rank 0: this process
    bind_device(str(device))
    model = with_lora(load_model(policy_dir, dtype).to(device), cfg.model.lora).train()
    tokenizer = load_tokenizer(policy_dir)
    ref = None
    if cfg.algorithm.kl_coef > 0:
        ref = load_model(policy_dir, dtype).to(device)
        ref.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
    version = load_state(model, optimizer) if load_state else 0
    hosts = {}
    if uses_ranks(cfg):  # data-parallel learner ranks: this process is rank 0 (docs/distributed.md)
        ranks = DataParallelLearner(cfg, model, ref, str(policy_dir), on_rank_phase, optimizer)
        learner, hosts = ranks, ranks.peers.rollout_hosts()
    else:
        learner = (OffPolicyLearner if rules.off_policy(cfg.train.schedule) else on_policy_learner)(
            model, cfg.algorithm, ref, LearnerOptions.from_config(cfg),  # learner.path: docs/learner.md
            OptimizerStep(optimizer, cfg.train.grad_clip))
    try:
        env = make_env(cfg.task)
        if cfg.rollout.speculation.enabled and (refused := speculation_refused(env)):
            raise ConfigError(refused)
        evaluator = (Evaluator(cfg, env, model, tokenizer, turn_stop_ids(tokenizer, policy_dir))
                     if cfg.train.eval_every else None)
        store = WeightStore(publish_view(model), counters=booted.counters)
        if version:
            store.publish(publish_view(model), version)  # the workers start from the resumed version
        fleet = Fleet(cfg, str(policy_dir), str(teacher_dir) if teacher_dir else None, store, origin, booted)
        if hosts:  # rollouts on every node of the run: docs/distributed-nodes.md
            fleet = PlacedFleet(cfg, fleet, hosts, origin, version)
    except BaseException:
        learner.close()  # a data-parallel learner's rank processes end with the failed set-up
        raise
    gc.freeze()  # as in the workers: full collections skip torch's and the model's objects
    return RunParts(policy_dir, model, tokenizer, params, optimizer, learner, env, store, fleet, evaluator)
