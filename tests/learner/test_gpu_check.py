"""``python -m bench.gpu_check``, the script a lent GPU runs, as a CPU dry run: it must not rot between loans."""

import argparse
import json
import sys

import pytest
import torch

from bench import gpu_check, gpu_runs


def test_the_gpu_check_runs_on_cpu_and_the_streamed_gradient_matches_the_reference():
    args = argparse.Namespace(groups=2, group_size=4, prompt_len=16, new_tokens=24, exact_groups=2)
    out = gpu_check.check_size("tiny", torch.device("cpu"), args)
    assert out["n_traj"] == 8 and out["tokens_out"] == 8 * 24
    assert out["rel_error_vs_reference"] < 1e-5
    assert out["peak_group_buffers"] >= 3  # G plus the two sums of a group
    assert 0 < out["tail_learner_s"] < out["learner_s"]
    assert out["derived_sync_step_s"] > out["derived_streaming_step_s"] > 0
    assert out["weights_mib"] > 0 and out["publish_ms"] > 0
    # eager vs captured decode on the same seeds: every row the same tokens
    assert out["captured_rows_same_tokens"] == out["engine_rows"] == 8
    assert out["captured_logprob_max_abs_diff"] < 1e-5 and out["captured_tokens_per_s"] > 0


def test_the_command_writes_its_json_where_asked(tmp_path, monkeypatch):
    path = tmp_path / "out.json"
    monkeypatch.setattr(sys, "argv", ["gpu_check", "--device", "cpu", "--sizes", "tiny", "--groups", "1",
                                      "--group-size", "2", "--prompt-len", "8", "--new-tokens", "8",
                                      "--exact-groups", "1", "--runs", "", "--json", str(path)])
    assert gpu_check.main() == 0
    written = json.loads(path.read_text())
    assert written["env"]["device"] == "cpu" and written["runs"] == {}
    assert written["sizes"]["tiny"]["captured_rows_same_tokens"] == 2


@pytest.mark.slow
def test_a_trainer_run_of_the_bench_workload_on_the_captured_engine_measures_its_steps(tmp_path):
    """A real ``thundersync train`` process with its rollout worker on the captured-decode engine."""
    out = gpu_runs.trainer_runs("cpu", "tiny", ["streaming-captured"], steps=2, prompts=2, group_size=4,
                                work=tmp_path, timeout_s=240.0)
    run = out["streaming-captured"]
    assert run["returncode"] == 0, run.get("error")
    assert run["steps_measured"] == 1 and run["timing_s/step_median"] > 0
    assert run["response/tokens_median"] > 0
    assert gpu_runs.run_config(tmp_path, "cuda", "sync", 4, 32, 8)["placement"]["colocated"] is True
