"""Shared-prompt backward on data-parallel ranks (``learner.world_size`` 2 over gloo, the torch
engine and DeepSpeed ZeRO 0/1/2): every group is learnt on its owner rank, so its prompt is
back-propagated there once and the reduced gradient equals the single-process reference; a real
two-rank run with it equals the single-process run without it and passes the audit."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from learner.checks.distributed_exactness import dist_cases, engine_setups, run_distributed

CLI = [sys.executable, "-m", "learner.cli"]


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["torch", "deepspeed"])
def test_two_ranks_with_shared_prompts_reduce_to_the_reference_gradient(engine):
    cases = [c for c in dist_cases() if c.shared_prompt]
    results = run_distributed([2], engine_setups([engine], [0, 1, 2]), cases=cases, timeout_s=600)
    assert len(results) == len(cases) * (1 if engine == "torch" else 3)
    for c in results:
        assert c["passed"] and c["unused_param_grad_zero"], c
        assert c["rel_error"] <= (1e-12 if engine == "torch" else 1e-6), c
    assert any(c["shared_prompt_rows"] > 0 for c in results)
    assert any(min(c["groups_per_rank"]) > 0 for c in results)  # both ranks back-propagated prompts


@pytest.mark.slow
def test_a_two_rank_run_with_shared_prompts_equals_the_single_process_run_without(tmp_path):
    cfg = yaml.safe_load(Path("configs/quickstart.yaml").read_text())
    cfg["model"]["dtype"] = "float64"  # the torch engine, round-off ~1e-16
    cfg["algorithm"].update(kl_coef=0.04, entropy_coef=0.01)  # every member has a backward
    runs = {}
    for name, world, shared in (("w1", 1, False), ("w2", 2, True)):
        cfg["learner"] = {"world_size": world, "shared_prompt_backward": shared}
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        r = subprocess.run(CLI + ["train", "--config", str(path), "--steps", "1", "--quiet", "--dump-step",
                                  str(tmp_path / name), "--events", str(tmp_path / f"{name}.jsonl")],
                           capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stderr[-3000:]
        audit = subprocess.run(CLI + ["audit", str(tmp_path / name)], capture_output=True, text=True, timeout=600)
        assert audit.returncode == 0 and json.loads(audit.stdout)["passed"], audit.stdout + audit.stderr[-2000:]
        values = next(json.loads(line)["values"] for line in (tmp_path / f"{name}.jsonl").read_text().splitlines()
                      if '"metrics"' in line)
        runs[name] = values, torch.load(tmp_path / name / "grad.pt", weights_only=True)
    (v1, g1), (v2, g2) = runs["w1"], runs["w2"]
    assert v1["reward/mean"] == v2["reward/mean"]  # the same batch was sampled
    assert v2["learner/shared_prompt_rows"] == 16.0  # summed over both ranks: every member
    assert v2["learner/0/trajectories"] > 0 and v2["learner/1/trajectories"] > 0
    assert v2["learner/ranks_in_sync"] == 1.0
    num = sum(float((g1[n] - g2[n]).square().sum()) for n in g1) ** 0.5
    den = sum(float(g1[n].square().sum()) for n in g1) ** 0.5
    assert num <= 1e-12 * den, num / den
