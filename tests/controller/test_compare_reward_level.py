"""The compare summary's automatic reward level: one every run crosses after its first step, or
none (said), never the first step's reward of a run whose reward falls."""

import pytest

from controller.comparisons.compare import default_reward_level, default_reward_levels, smoothed

from .conftest import make_run
from .test_api_compare import store_steps

pytestmark = pytest.mark.django_db


def rows(*rewards):
    return [{"step": i, "reward/mean": r} for i, r in enumerate(rewards)]


def test_the_level_is_above_every_first_step_and_reached_later_by_every_run():
    # raw rewards: run a rises 0.2 -> 0.5, run b 0.3 -> 0.45 -> 0.4; every run crosses 0.45 after step 0
    assert default_reward_level([rows(0.2, 0.3, 0.5), rows(0.3, 0.45, 0.4)], 0.0) == 0.45
    a = smoothed([0.2, 0.3, 0.5], 0.5)
    b = smoothed([0.3, 0.45, 0.4], 0.5)
    assert default_reward_level([rows(0.2, 0.3, 0.5), rows(0.3, 0.45, 0.4)], 0.5) == min(max(a[1:]), max(b[1:]))


@pytest.mark.parametrize("curves", [
    [rows(0.31, 0.2, 0.1), rows(0.2, 0.4, 0.6)],  # one run's reward falls: the old default was its 0.31 "(step 0)"
    [rows(0.5, 0.6), rows(0.7, 0.65)],  # each rises or not, but no level is above both first steps and reached by both
    [rows(0.2), rows(0.1, 0.3)],  # one rewarded step: nothing to cross
])
def test_no_level_when_some_run_never_rises_above_its_first_step(curves):
    assert default_reward_level(curves, 0.0) is None


def test_levels_from_the_curves_give_every_improved_run_a_time():
    # a rises 0.5 -> 0.6, b 0.7 -> 0.8: no level above both first steps and reached by both;
    # two levels, each run crossing one after its first step
    levels = default_reward_levels([rows(0.5, 0.6), rows(0.7, 0.8)], 0.0)
    assert levels == [0.6, 0.8]
    # overlapping intervals share one level (the lower best)
    assert default_reward_levels([rows(0.2, 0.3, 0.5), rows(0.3, 0.45, 0.4)], 0.0) == [0.45]
    # nothing improved: no level
    assert default_reward_levels([rows(0.5, 0.4, 0.3), rows(0.5, 0.45)], 0.0) == []


def test_the_api_says_why_there_is_no_time_to_reward(alice_client, alice_experiment, sync_preset, streaming_preset):
    falling = make_run(alice_experiment, sync_preset, steps=3, name="falling")
    store_steps(falling, [(0, 1, 0.5, 0.6, 0.313, 0), (1, 2, 1.5, 1.6, 0.2, 0), (2, 3, 2.5, 2.6, 0.1, 0)])
    rising = make_run(alice_experiment, streaming_preset, steps=3, name="rising")
    store_steps(rising, [(0, 1, 0.5, 0.6, 0.1, 0), (1, 2, 1.5, 1.6, 0.3, 0), (2, 3, 2.5, 2.6, 0.5, 0)])
    body = alice_client.get(f"/api/compare/?runs={falling.pk},{rising.pk}&smoothing=0").json()
    # the rising run is timed to its own best after step 0; the falling one is named, no time
    assert body["reward_levels"] == [0.5] and body["reward_level"] == 0.5
    assert [r["time_to_reward_s"] for r in body["runs"]] == [None, 3.0]  # the end of step 2
    assert [r["reward_improved"] for r in body["runs"]] == [False, True]
    assert "1 run never rose above its first step's reward (falling)" in body["reward_level_note"]
    chosen = alice_client.get(f"/api/compare/?runs={falling.pk},{rising.pk}&reward=0.25&smoothing=0").json()
    assert chosen["reward_level_note"] == "" and chosen["runs"][1]["reward_step"] == 1
    low = alice_client.get(f"/api/compare/?runs={falling.pk},{rising.pk}&reward=0.05&smoothing=0").json()
    assert [r["reward_at_first_step"] for r in low["runs"]] == [True, True]
    assert low["reward_level_note"].startswith("every run's smoothed reward was already at or above 0.050")


def test_no_run_improved_is_said_plainly(alice_client, alice_experiment, sync_preset, streaming_preset):
    runs = []
    for preset in (sync_preset, streaming_preset):  # the demo's reward falling 0.5 -> 0.3 in every run
        run = make_run(alice_experiment, preset, steps=3, name=preset.name)
        store_steps(run, [(0, 1, 0.5, 0.6, 0.5, 0), (1, 2, 1.5, 1.6, 0.4, 0), (2, 3, 2.5, 2.6, 0.3, 0)])
        runs.append(run)
    body = alice_client.get(f"/api/compare/?runs={runs[0].pk},{runs[1].pk}&smoothing=0").json()
    assert body["reward_levels"] == [] and body["reward_level"] is None
    assert body["reward_level_note"] == ("no run improved: every run's smoothed reward stayed at or below its first "
                                         "step's (0.50 at the first step, 0.30 at the last; the reward chart shows the curves)")
    assert [r["time_to_reward_s"] for r in body["runs"]] == [None, None]
