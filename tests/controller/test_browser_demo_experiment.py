"""The demo experiment (manage.py demo) as a new user first sees it, in a real browser: its
description says what a run is (20 steps of about half a second each, as measured, not "a few seconds"),
its runs train 20 steps, and the config panel shows every line whole."""

import pytest
from tests.harness.web_harness import browser_page, live_url, log_in  # noqa: F401 (fixtures)

from controller.management.commands.demo import DEMO_STEPS, ensure_demo_experiment, ensure_presets

pytestmark = pytest.mark.browser


def test_the_demo_experiment_says_what_a_run_is_and_shows_its_whole_config(live_url, browser_page, alice):
    """Before the fix: "a run takes about a minute on CPU" for a 1-step run of 3.7 s; the config
    panel's first line cut off."""
    page, errors = browser_page
    ensure_presets()
    experiment = ensure_demo_experiment(alice)
    assert experiment.run_config().train.steps == DEMO_STEPS == 20
    log_in(page, live_url, "alice", "alice-password")
    page.goto(f"{live_url}/experiments/{experiment.pk}/")
    description = page.inner_text(".page-head .sub")
    assert "20 GRPO steps per run" in description and "each step takes about half a second" in description
    assert "a few seconds" not in description and "about a minute" not in description
    config = page.locator("#experiment-config")
    lines = config.inner_text().splitlines()
    assert lines[0].startswith("# The demo experiment") and "  steps: 20" in lines
    # wrapped, not clipped: nothing wider than the panel
    assert page.evaluate("(() => { const pre = document.getElementById('experiment-config');"
                         " return pre.scrollWidth <= pre.clientWidth; })()")
    assert page.input_value("#id_steps") == "" and "default: the experiment's train.steps" in page.inner_text("#launch-form")
    assert errors == []
