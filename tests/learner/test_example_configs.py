"""The example configs of data tasks train end to end on CPU with the built-in policy, and
their first step's dump passes the independent audit; bad data stops a run before it starts."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
import yaml

CLI = [sys.executable, "-m", "learner.cli"]


def thundersync(*args, cwd=None):
    return subprocess.run(CLI + list(args), capture_output=True, text=True, cwd=cwd, timeout=600)


def metrics(events_path) -> list[dict]:
    events = [json.loads(line) for line in events_path.read_text().splitlines()]
    return [e["values"] for e in events if e["type"] == "metrics"]


@pytest.mark.slow
@pytest.mark.parametrize("config", ["configs/jsonl-math.yaml", "configs/reasoning-gym.yaml"])
def test_an_example_trains_two_steps_and_its_dump_passes_the_audit(tmp_path, config):
    dump, events = tmp_path / "dump", tmp_path / "events.jsonl"
    r = thundersync("train", "--config", config, "--steps", "2", "--dump-step", str(dump), "--events", str(events), "--quiet")
    assert r.returncode == 0, r.stderr
    steps = metrics(events)
    assert len(steps) == 2 and all(s["task/turn_errors"] >= 0 and s["task/reward_errors"] == 0 for s in steps)
    if "jsonl-math" in config:  # train.eval_every: 2 -> greedy eval on the 12 held-out rows after step 1
        assert "eval/reward" not in steps[0] and steps[1]["eval/prompts"] == 12 and 0 <= steps[1]["eval/pass@1"] <= 1
    grads = torch.load(dump / "grad.pt", weights_only=True)
    assert sum(float(g.square().sum()) for g in grads.values()) > 0  # the audit compares a real gradient
    audit = thundersync("audit", str(dump))
    result = json.loads(audit.stdout)
    assert audit.returncode == 0 and result["passed"] and result["n_traj"] == 16, audit.stdout + audit.stderr


def test_bad_data_stops_the_run_before_it_starts_with_exit_2(tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text('{"question": "1+1=?", "answer": "2"}\n{"answer": "4"}\n')
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(yaml.safe_dump({"task": {"name": "dataset", "path": str(data), "prompt_field": "question"}}))
    r = thundersync("train", "--config", str(cfg), "--steps", "0")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [
        "thundersync: invalid config: task.path: rows.jsonl line 2: field 'question' (task.prompt_field) is missing"]


@pytest.mark.slow
def test_score_zero_counts_failing_rewards_in_the_step_metrics(tmp_path):
    (tmp_path / "picky.py").write_text(
        "def score(completion, answer, row):\n"
        "    if row['id'] % 2:\n        raise ValueError('odd row')\n"
        "    return float(completion.strip() == answer)\n")
    cfg = yaml.safe_load(open("configs/jsonl-math.yaml"))
    cfg["task"].update(reward=str(tmp_path / "picky.py") + ":score", on_bad_data="score-zero")
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    events = tmp_path / "events.jsonl"
    r = thundersync("train", "--config", str(path), "--steps", "1", "--events", str(events), "--quiet")
    assert r.returncode == 0, r.stderr
    [step] = metrics(events)
    assert step["task/reward_errors"] > 0  # the odd rows' trajectories that answered: scored 0, counted

    cfg["task"]["on_bad_data"] = "error"
    path.write_text(yaml.safe_dump(cfg))
    r = thundersync("train", "--config", str(path), "--steps", "1", "--quiet")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert f"task.reward: {tmp_path / 'picky.py'}:score raised ValueError: odd row (math.jsonl line" in r.stderr
