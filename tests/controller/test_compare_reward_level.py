"""The compare summary's automatic reward level: one every run crosses after its first step, or
none (said), never the first step's reward of a run whose reward falls."""

import pytest

from controller.compare import NO_LEVEL, default_reward_level, smoothed

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


def test_the_api_says_why_there_is_no_time_to_reward(alice_client, alice_experiment, sync_preset, streaming_preset):
    falling = make_run(alice_experiment, sync_preset, steps=3, name="falling")
    store_steps(falling, [(0, 1, 0.5, 0.6, 0.313, 0), (1, 2, 1.5, 1.6, 0.2, 0), (2, 3, 2.5, 2.6, 0.1, 0)])
    rising = make_run(alice_experiment, streaming_preset, steps=3, name="rising")
    store_steps(rising, [(0, 1, 0.5, 0.6, 0.1, 0), (1, 2, 1.5, 1.6, 0.3, 0), (2, 3, 2.5, 2.6, 0.5, 0)])
    body = alice_client.get(f"/api/compare/?runs={falling.pk},{rising.pk}").json()
    assert body["reward_level"] is None and body["reward_level_note"] == NO_LEVEL
    assert [r["time_to_reward_s"] for r in body["runs"]] == [None, None]
    chosen = alice_client.get(f"/api/compare/?runs={falling.pk},{rising.pk}&reward=0.25&smoothing=0").json()
    assert chosen["reward_level_note"] == "" and chosen["runs"][1]["reward_step"] == 1
