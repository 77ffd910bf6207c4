"""Periodic eval: greedy is the model's argmax through the real agent loop, pass@k counts
prompts with a solved sample, the held-out split is used, and a run reports eval/* metrics
on the steps ``train.eval_every`` names."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import yaml

from learner.config import RunConfig
from learner.evaluation import Evaluator, eval_tasks
from learner.tasks.chat import turn_stop_ids
from learner.tasks.env import task_for_group
from learner.tasks.registry import make_env
from learner.models.loading import load_model, load_tokenizer, resolve_model_dir
from learner.timeline import MemorySink

torch.set_num_threads(1)


def evaluator(**train) -> Evaluator:
    cfg = RunConfig.model_validate({"train": {"eval_every": 1, "eval_prompts": 6, **train}})
    policy = resolve_model_dir("builtin:tiny")
    tok = load_tokenizer(policy)
    return Evaluator(cfg, make_env(cfg.task), load_model(policy), tok, turn_stop_ids(tok, policy))


def test_greedy_eval_takes_the_models_most_likely_token_every_time():
    ev = evaluator()
    trajs = ev.rollouts(step=0)
    again = ev.rollouts(step=0)  # greedy: the same trajectories again
    assert len(trajs) == 6 and [(t.input_ids, t.reward) for t in trajs] == [(t.input_ids, t.reward) for t in again]
    model = ev.model
    with torch.no_grad():
        for traj in trajs:
            ids = torch.tensor([traj.input_ids])
            best = model(input_ids=ids).logits[0].argmax(-1)  # (T,): the argmax after each prefix
            for start, end in traj.turn_spans:
                assert traj.input_ids[start:end] == best[start - 1:end - 1].tolist()
    values = ev.run(step=0)
    assert values["eval/reward"] == sum(t.reward for t in trajs) / 6
    assert values["eval/pass@1"] == sum(t.reward >= 1 for t in trajs) / 6 and values["eval/prompts"] == 6


def test_pass_at_k_counts_prompts_with_a_solved_sample_on_fixed_draws():
    ev = evaluator(eval_mode="pass@k", eval_k=4)
    trajs = ev.rollouts(step=0)
    assert len(trajs) == 24
    solved = {t.group for t in trajs if t.reward >= 1}
    assert [t.input_ids for t in trajs] == [t.input_ids for t in ev.rollouts(step=3)]  # same seeds each eval
    values = ev.run(step=0)
    assert values["eval/pass@4"] == len(solved) / 6 and values["eval/pass@4"] >= values["eval/reward"]


def test_a_dataset_evaluates_its_held_out_rows(tmp_path):
    cfg = RunConfig.model_validate({"task": {"name": "dataset", "path": "configs/data/math.jsonl",
                                             "prompt_field": "question", "eval_fraction": 0.25}})
    env = make_env(cfg.task)
    held = eval_tasks(env, cfg.seed, 100)
    assert len(held) == 12
    train_rows = {task_for_group(env, g, cfg.seed).expression for g in range(36)}
    assert len(train_rows) == 36 and train_rows.isdisjoint({t.expression for t in held})


def test_eval_without_held_out_rows_is_a_config_error(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"task": {"name": "dataset", "path": "configs/data/math.jsonl",
                                            "prompt_field": "question"}, "train": {"eval_every": 1}}))
    r = subprocess.run([sys.executable, "-m", "learner.cli", "train", "--config", str(cfg), "--steps", "0"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "thundersync: invalid config: train.eval_every: the task has no held-out prompts (set task.eval_fraction)"]


@pytest.mark.slow
def test_a_run_reports_eval_metrics_on_the_steps_eval_every_names():
    from learner.driver.loop import train

    cfg = RunConfig.model_validate({
        "task": {"tool_latency": {"distribution": "none"}},
        "train": {"steps": 2, "prompts_per_step": 2, "group_size": 4, "eval_every": 2, "eval_prompts": 4},
    })
    sink = MemorySink()
    train(cfg, sink)
    steps = [e["values"] for e in sink.events if e.get("type") == "metrics"]
    assert "eval/reward" not in steps[0]
    assert {"eval/reward", "eval/pass@1", "eval/prompts", "eval/seconds"} <= set(steps[1])
    assert 0.0 <= steps[1]["eval/reward"] <= 1.0 and steps[1]["eval/prompts"] == 4
