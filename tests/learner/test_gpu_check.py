"""``python -m bench.gpu_check``, the script a lent GPU runs, as a CPU dry run: it must not rot between loans."""

import argparse

import torch

from bench import gpu_check


def test_the_gpu_check_runs_on_cpu_and_the_streamed_gradient_matches_the_reference():
    args = argparse.Namespace(groups=2, group_size=4, prompt_len=16, new_tokens=24, exact_groups=2)
    out = gpu_check.check_size("tiny", torch.device("cpu"), args)
    assert out["n_traj"] == 8 and out["tokens_out"] == 8 * 24
    assert out["rel_error_vs_reference"] < 1e-5
    assert out["peak_group_buffers"] >= 3  # G plus the two sums of a group
    assert 0 < out["tail_learner_s"] < out["learner_s"]
    assert out["derived_sync_step_s"] > out["derived_streaming_step_s"] > 0
    assert out["weights_mib"] > 0 and out["publish_ms"] > 0
