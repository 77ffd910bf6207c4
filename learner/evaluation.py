"""Periodic evaluation on held-out prompts (``train.eval_every``; docs/tasks.md, "Eval").

Every ``eval_every`` steps the driver runs the task's held-out prompts (a dataset's
``task.eval_fraction`` rows, reasoning-gym items from another seed, fresh arith-tool draws)
through the real agent loop (``AgentWorker``: the same chat format, tools and verifier as
training) on a torch engine around the learner's own model, in the learner's process, so
it sees the weights just published without a copy:

- ``greedy``: one greedy (argmax) trajectory per prompt; ``eval/reward`` is their mean
  reward and ``eval/pass@1`` the share with reward >= 1;
- ``pass@k``: ``eval_k`` samples per prompt at the rollout temperature, each with a fixed
  seed so steps compare on the same draws; ``eval/pass@<k>`` is the share of prompts with
  at least one sample of reward >= 1.

The values join that step's metrics event (``eval/seconds`` is the time it took; it runs
after the step's publish, so the next step's window holds it as learner time outside any
learner span).
"""

from __future__ import annotations

import queue
import random
import time

from learner.config import RunConfig
from learner.tasks.env import Environment, Task
from learner.rollout.processes.messages import Finished, Work, WorkItem
from learner.timeline import Metric
from learner.trajectory import Trajectory

SOLVED = 1.0  # a trajectory counts as solved (pass@k) at full reward


def eval_tasks(env: Environment, seed: int, limit: int) -> list[Task]:
    """The held-out prompts: the task's own split when it has one, else fresh draws from a
    seed no training group uses."""
    own = getattr(env, "eval_tasks", None)
    if own is not None:
        return own(seed, limit)
    return [env.sample_task(random.Random(f"eval-{seed}-{i}")) for i in range(limit)]


def _eval_config(cfg: RunConfig) -> RunConfig:
    """The run's config for the eval loop: greedy = temperature 0 (the engine's argmax), no
    modelled tool latency (eval measures answers, not timing), no weight following."""
    rollout = cfg.rollout.model_copy(update={"temperature": 0.0} if cfg.train.eval_mode == "greedy" else {})
    task = cfg.task.model_copy(update={"tool_latency": cfg.task.tool_latency.model_copy(update={"distribution": "none"})})
    train = cfg.train.model_copy(update={"schedule": "sync"})
    return cfg.model_copy(update={"rollout": rollout, "task": task, "train": train})


class Evaluator:
    def __init__(self, cfg: RunConfig, env: Environment, model, tokenizer, stop_ids: list[int]):
        self.cfg, self.model, self.tok, self.stop_ids = cfg, model, tokenizer, stop_ids
        self.samples = 1 if cfg.train.eval_mode == "greedy" else cfg.train.eval_k
        self.tasks = eval_tasks(env, cfg.seed, cfg.train.eval_prompts)
        if not self.tasks:
            raise ValueError("train.eval_every: the task has no held-out prompts (set task.eval_fraction)")
        self.worker = None  # built on first use: the agent loop, its env and the engine

    def due(self, step: int) -> bool:
        every = self.cfg.train.eval_every
        return every > 0 and (step + 1) % every == 0

    def _agent(self):
        if self.worker is None:
            from learner.rollout.engine.torch_engine import TorchEngine
            from learner.rollout.processes.agent_worker import AgentWorker

            engine = TorchEngine(self.model, self.tok.pad_token_id,
                                 continuous_batching=self.cfg.rollout.continuous_batching)
            self.worker = AgentWorker(-1, _eval_config(self.cfg), engine, self.tok, None, None, queue.SimpleQueue(),
                                      time.monotonic(), stop_ids=self.stop_ids)
        return self.worker

    def rollouts(self, step: int, timeout_s: float = 3600.0) -> list[Trajectory]:
        was_training = self.model.training
        worker = self._agent()
        self.model.eval()
        items = [WorkItem(p * self.samples + j, p, task, 7_000_003 * p + j)
                 for p, task in enumerate(self.tasks) for j in range(self.samples)]
        worker.handle(Work(step, items))
        try:
            worker.run_loops(timeout_s)
        finally:
            worker.loops.clear()
            self.model.train(was_training)
        out = []
        while not worker.out_q.empty():
            msg = worker.out_q.get_nowait()
            if isinstance(msg, Finished) and isinstance(msg.item, Trajectory):
                out.append(msg.item)
        return sorted(out, key=lambda t: t.id)

    def run(self, step: int) -> dict[str, float]:
        t0 = time.monotonic()
        trajs = self.rollouts(step)
        by_prompt: dict[int, list[float]] = {}
        for t in trajs:
            by_prompt.setdefault(t.group, []).append(t.reward)
        solved = sum(1 for rewards in by_prompt.values() if max(rewards) >= SOLVED)
        return {
            Metric.EVAL_REWARD: sum(t.reward for t in trajs) / len(trajs),
            f"{Metric.EVAL_PASS_AT}{self.samples}": solved / len(by_prompt),
            Metric.EVAL_PROMPTS: float(len(by_prompt)),
            Metric.EVAL_SECONDS: time.monotonic() - t0,
        }
