"""thundersync race: a real (tiny) race of two schedules over two seeds, and its arithmetic."""

from __future__ import annotations

import json

import pytest

from learner.bench.race import auto_levels, figures, smoothed, to_level
from learner.cli import main

TINY = """\
name: tiny-race
seed: 0
model: {policy: "builtin:tiny"}
task: {name: arith-tool, min_ops: 1, max_ops: 2, tool_latency: {distribution: none}}
rollout: {workers: 1, max_new_tokens: 16}
algorithm: {objective: grpo}
train: {steps: 2, prompts_per_step: 2, group_size: 2}
"""


def _curve(rewards, step_s=1.0, tokens=10.0, weight=0.0):
    return {"seconds": [step_s * (i + 1) for i in range(len(rewards))],
            "tokens": [tokens * (i + 1) for i in range(len(rewards))], "reward": rewards,
            "smoothed": smoothed(rewards, weight)}


def test_auto_levels_are_crossed_by_every_run_after_its_first_step():
    runs = [_curve([0.2, 0.3, 0.5]), _curve([0.25, 0.4, 0.35]), _curve([0.2, 0.28, 0.45])]
    levels, why = auto_levels(runs)
    assert why is None and levels == [pytest.approx(0.2 + (0.4 - 0.2) / 2), pytest.approx(0.4)]
    assert all(to_level(c, levels[-1]) is not None for c in runs)
    odd = [_curve([0.2, 0.123456789]), _curve([0.1, 0.5])]  # a best that rounding up would put out of reach
    assert all(to_level(c, level) is not None for c in odd for level in auto_levels(odd)[0])
    assert to_level(_curve([0.9, 0.1]), 0.5) is None  # step 0 does not count: nothing learnt yet
    falling = [_curve([0.3, 0.2, 0.1]), _curve([0.3, 0.25, 0.2])]
    assert auto_levels(falling)[0] == [] and "no run learnt beyond its start" in auto_levels(falling)[1]


def test_figures_give_medians_over_seeds_and_count_the_seeds_that_reached_a_level():
    runs = {"sync": {0: _curve([0.2, 0.5], step_s=2.0), 1: _curve([0.2, 0.6], step_s=3.0), 2: _curve([0.2, 0.1])},
            "streaming": {0: _curve([0.2, 0.5], step_s=1.0), 1: _curve([0.2, 0.6], step_s=1.5), 2: _curve([0.2, 0.55])}}
    out = figures(runs, [0.5])
    sync, streaming = out["sync"]["levels"][0], out["streaming"]["levels"][0]
    assert (sync["reached"], sync["seeds"], sync["seconds_median"]) == (2, 3, pytest.approx(5.0))
    assert streaming["reached"] == 3 and streaming["seconds_median"] == pytest.approx(2.0)
    assert streaming["seconds_ci90"][0] <= 2.0 <= streaming["seconds_ci90"][1]
    assert streaming["tokens_median"] == 20.0


@pytest.mark.slow
def test_a_tiny_race_trains_every_schedule_on_every_seed_and_reports_each(tmp_path):
    """Two schedules, one seed, two steps each: two real runs (the per-seed arithmetic is tested above)."""
    (tmp_path / "tiny.yaml").write_text(TINY)
    rc = main(["race", "--config", str(tmp_path / "tiny.yaml"), "--schedules", "sync,streaming", "--seeds", "1",
               "--levels", "0.0", "--json", str(tmp_path / "race.json"), "--html", str(tmp_path / "race.html"),
               "--events-dir", str(tmp_path / "ev")])
    assert rc == 0
    doc = json.loads((tmp_path / "race.json").read_text())
    assert sorted(p.name for p in (tmp_path / "ev").glob("*.jsonl")) == ["race-streaming-seed1.jsonl", "race-sync-seed1.jsonl"]
    for name in ("sync", "streaming"):
        assert set(doc["curves"][name]) == {"1"}
        for c in doc["curves"][name].values():
            assert len(c["seconds"]) == 2 and c["seconds"] == sorted(c["seconds"]) and c["tokens"][-1] > 0
        level = doc["schedules"][name]["levels"][0]
        assert level["reached"] == 1 and level["seconds_median"] > 0  # any reward >= 0 after step 0
    page = (tmp_path / "race.html").read_text()
    assert "<script src" not in page and "Smoothed reward against wall-clock" in page


def test_bad_flags_are_one_line_naming_the_flag(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["race", "--seeds", "1,1"])
    assert "--seeds" in capsys.readouterr().err
    assert main(["race", "--smoothing", "1.0"]) == 2
    assert "--smoothing: must be in [0, 1)" in capsys.readouterr().err
