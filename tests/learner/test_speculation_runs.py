"""Speculation on vs off in whole runs (docs/speculation.md): the same seed gives the same tokens
and rewards in every step and the same gradients (relative error ≤ 1e-6, float32), under sync
and streaming, with prompts short and long enough that rejected drafts' remainders start from the
verification forward's keys/values; and a speculative run SIGKILLed after a checkpoint resumes to the same final
weights, bit for bit, as one never stopped (the drafts in flight are lost; verification gives
the same tokens either way)."""

from __future__ import annotations

import os
import signal

import pytest
import torch
import yaml

from learner.config import load_config
from learner.driver.loop import Trainer, train
from learner.checks.exactness import relative_error
from learner.timeline import Metric, MemorySink
from tests.learner.test_cli_faults import final_weights, kill_each_once_checkpointed, popen_train, wait_gone


# ~70 tokens before every question (the built-in tokenizer is per character): contexts pass the prefix
# store's MIN_TOKENS, so rejected drafts' remainders start from verification's keys/values
PREAMBLE = "Use the calculator for every operation, one operation per call, then answer."


def run(schedule: str, speculation: bool, monkeypatch, preamble: str | None = None, steps: int = 3,
        check_kept: bool = True, gate: str = "always") -> tuple[list, list, list]:
    cfg = load_config("configs/quickstart.yaml")
    cfg.train.schedule, cfg.train.steps = schedule, steps
    cfg.rollout.speculation.gate = gate  # (every batch drafted: the identity is checked on drafts)
    cfg.rollout.speculation.enabled = speculation
    cfg.task.prompt_preamble = preamble
    batches, grads = [], []
    finish_step, step = Trainer.finish_step, torch.optim.AdamW.step

    def record_batch(self, t_end):
        batches.append(sorted((t.id, tuple(t.input_ids), tuple(t.loss_mask), t.reward) for t in self.rec.trajs))
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
    if speculation and check_kept:
        kept = [m["values"][Metric.KEPT_TOKEN_SHARE] for m in sink.metrics()[1:]]
        assert all(k > 0 for k in kept) and sink.metrics()[1]["values"][Metric.DRAFTED_TOKENS] > 0
    return batches, grads, [m["values"] for m in sink.metrics()]


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["sync", "streaming"])
def test_speculation_changes_no_token_reward_or_gradient(schedule: str, monkeypatch) -> None:
    off_steps, off_grads, _ = run(schedule, False, monkeypatch)
    on_steps, on_grads, _ = run(schedule, True, monkeypatch)
    assert_equal_runs(off_steps, off_grads, on_steps, on_grads)


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["sync", "streaming"])
def test_remainders_from_verification_kv_change_no_token_reward_or_gradient(schedule: str, monkeypatch) -> None:
    """Contexts past the store's threshold: the rejected drafts' remainders start from the
    verification forward's keys/values (speculation/verified_kv_tokens > 0), and every step's
    tokens, rewards and gradients still equal speculation off."""
    off_steps, off_grads, _ = run(schedule, False, monkeypatch, PREAMBLE)
    on_steps, on_grads, metrics = run(schedule, True, monkeypatch, PREAMBLE)
    assert_equal_runs(off_steps, off_grads, on_steps, on_grads)
    assert sum(m.get(Metric.VERIFIED_KV_TOKENS, 0.0) for m in metrics) > 0


def assert_equal_runs(off_steps: list, off_grads: list, on_steps: list, on_grads: list, n: int = 3) -> None:
    assert len(on_steps) == len(off_steps) == n
    for a, b in zip(off_steps, on_steps):
        assert a == b  # ids, tokens, masks and rewards, step by step
    for a, b in zip(off_grads, on_grads):
        assert relative_error(b, a) <= 1e-6


@pytest.mark.slow
def test_a_speculative_run_killed_and_resumed_ends_with_the_same_weights(tmp_path) -> None:
    data = yaml.safe_load(open("configs/quickstart.yaml"))
    data["rollout"]["speculation"] = {"enabled": True}
    config = tmp_path / "spec.yaml"
    config.write_text(yaml.safe_dump(data))
    out = {x: tmp_path / x for x in "AB"}
    procs = {x: popen_train("--config", str(config), "--schedule", "streaming", "--steps", "4",
                            "--checkpoint-every", "1", "--output", str(path)) for x, path in out.items()}
    resumed = None
    try:
        kill_each_once_checkpointed({"B": procs["B"]}, {"B": out["B"] / "checkpoints" / "step-000001"})
        wait_gone(procs["B"].pid)
        stderr_a = procs["A"].communicate(timeout=300)[1]
        resumed = popen_train("--resume", str(out["B"]))
        stderr_b = resumed.communicate(timeout=300)[1]
    finally:
        for proc in [*procs.values(), resumed]:
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert procs["A"].returncode == 0 and resumed.returncode == 0, (stderr_a, stderr_b)
    wa, wb = final_weights(out["A"]), final_weights(out["B"])
    assert wa.keys() == wb.keys() and all(torch.equal(wa[n], wb[n]) for n in wa)
