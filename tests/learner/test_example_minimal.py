"""examples/minimal_grpo_streaming.py, the one-file example of the streaming learner: its step-0
gradient is the batch-synchronous one and the policy learns its task within a few steps."""

import importlib.util
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "minimal_grpo_streaming.py"


@pytest.mark.slow
def test_the_minimal_example_is_exact_and_learns():
    spec = importlib.util.spec_from_file_location("minimal_grpo_streaming", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    out = example.main(steps=10, seed=0, quiet=True)
    assert out["step0_max_abs_diff"] <= 1e-6
    rewards = out["rewards"]
    assert rewards[0] < 0.1 and max(rewards[-3:]) > 0.5, rewards
    assert len(EXAMPLE.read_text().splitlines()) <= 100  # one screen
