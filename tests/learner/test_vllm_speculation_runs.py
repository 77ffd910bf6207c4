"""Speculation on vs off with vLLM rollouts (docs/speculation-verify.md, "On vLLM"): 3 ``streaming`` steps
give the same tokens and rewards in every step and the same gradients (relative error <= 1e-6),
the drafts verified by vLLM's own prefill (rollout/vllm_backend/vllm_verify.py) and continued by vLLM."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm")

from learner.config import RunConfig  # noqa: E402
from learner.driver.loop import Trainer, train  # noqa: E402
from learner.timeline import Metric, MemorySink  # noqa: E402
from tests.learner.test_speculation_runs import assert_equal_runs  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def run(speculation: bool, monkeypatch) -> tuple[list, list, list]:
    cfg = RunConfig.model_validate({
        "rollout": {"engine": "vllm", "max_new_tokens": 16, "speculation": {"enabled": speculation}},
        "task": {"tool_latency": {"distribution": "constant", "median_s": 0.01}},
        "train": {"schedule": "streaming", "steps": 3, "prompts_per_step": 2, "group_size": 4},
    })
    steps, grads = [], []
    finish_step, step = Trainer.finish_step, torch.optim.AdamW.step

    def record_batch(self, t_end):
        steps.append(sorted((t.id, tuple(t.input_ids), tuple(t.loss_mask), t.reward) for t in self.rec.trajs))
        return finish_step(self, t_end)

    def record_gradient(self, *args, **kwargs):
        grads.append({i: p.grad.clone() for g in self.param_groups for i, p in enumerate(g["params"])
                      if p.grad is not None})
        return step(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "finish_step", record_batch)
    monkeypatch.setattr(torch.optim.AdamW, "step", record_gradient)
    sink = MemorySink()
    train(cfg, sink)
    monkeypatch.undo()
    return steps, grads, [m["values"] for m in sink.metrics()]


def test_vllm_speculation_changes_no_token_reward_or_gradient(monkeypatch) -> None:
    off_steps, off_grads, _ = run(False, monkeypatch)
    on_steps, on_grads, metrics = run(True, monkeypatch)
    assert_equal_runs(off_steps, off_grads, on_steps, on_grads)
    assert sum(m[Metric.DRAFTED_TOKENS] for m in metrics[1:]) > 0  # drafts were sampled and verified
    assert all(0.0 <= m[Metric.KEPT_TOKEN_SHARE] <= 1.0 for m in metrics[1:])
