"""Readable at scale, in a real browser against the real app: with 128 rollout lanes, two learner
ranks and eight replicas, the learner and replica lanes stay pinned at the top, each in a full
labelled row with its bars painted, folded or not: unfolded (every rollout lane shown), and
zoomed into a few rollout lanes (the zoom narrows the rollout lanes, never the pinned ones);
double-click zooms back out to the folded view."""

import io

import pytest
from PIL import Image
from tests.harness.web_harness import agent_run_events, browser_page, live_url  # noqa: F401 (fixtures)

from controller.models import Span, StepMetric

from .conftest import make_run
from .test_browser_insight import open_run_page

pytestmark = pytest.mark.browser
WORKERS, SLOTS = 8, 16
PINNED = ["learner/0", "learner/1", *(f"replica/{w}" for w in range(WORKERS))]
BACKWARD_RGB = (0xe1, 0x57, 0x59)  # static/js/spans.js: learner.backward


@pytest.fixture
def wide_run(alice_experiment, streaming_preset):
    found = make_run(alice_experiment, streaming_preset, steps=2, name="128 lanes, 2 ranks, 8 replicas")
    spans, metrics = agent_run_events(2, groups=32, group_size=4, workers=WORKERS, slots=SLOTS, max_turns=2, seed=5)
    for e in spans:  # odd trajectories train on rank 1; each worker's replica loads every publish
        if e["kind"] == "learner.backward" and e["traj"] % 2:
            e["lane"] = "learner/1"
    publishes = [e for e in spans if e["kind"] == "learner.publish"]
    for p in publishes:
        for w in range(WORKERS):
            spans.append({**p, "lane": f"replica/{w}", "t0": p["t1"], "t1": p["t1"] + 0.02, "seq": None})
    for seq, e in enumerate(spans):
        e["seq"] = seq
    keys = ("seq", "step", "kind", "lane", "traj", "group", "turn", "policy_version", "tokens", "t0", "t1")
    Span.objects.bulk_create([Span(run=found, **{k: e[k] for k in keys}) for e in spans])
    StepMetric.objects.bulk_create([StepMetric(run=found, step=m["step"], values=m["values"]) for m in metrics])
    return found


def lane_axis(page) -> dict:
    return page.evaluate("""(() => { const g = document.getElementById('gantt'), ya = g._fullLayout.yaxis;
        const lanes = ya.categoryarray;
        return {lanes, px: ya._length / Math.abs(ya.range[0] - ya.range[1]), labels: [...g.querySelectorAll('.ytick text')].map((t) => t.textContent),
                rows: Object.fromEntries(lanes.map((l) => [l, ya._offset + ya.l2p(ya.d2l(l))]))}; })()""")


def assert_pinned_on_top(page, axis) -> None:
    assert axis["lanes"][:len(PINNED)] == PINNED
    assert all(lane.startswith("rollout/") for lane in axis["lanes"][len(PINNED):])
    assert set(PINNED) <= set(axis["labels"])
    assert axis["px"] >= 12, f"{axis['px']:.1f} px a lane"
    # every pinned row is above every rollout row, and learner/0's row holds painted backward bars
    assert max(axis["rows"][p] for p in PINNED) < min(y for lane, y in axis["rows"].items() if lane not in PINNED)
    shot = Image.open(io.BytesIO(page.locator("#gantt").screenshot())).convert("RGB")
    y = round(axis["rows"]["learner/0"])
    strip = shot.crop((0, y - 2, shot.width, y + 3))
    assert sum(1 for p in strip.get_flattened_data() if p == BACKWARD_RGB) > 20


def test_learner_and_replica_lanes_stay_pinned_and_labelled_at_128_rollout_lanes(
        live_url, browser_page, alice, wide_run):
    page, errors = browser_page
    open_run_page(page, live_url, wide_run)
    folded = lane_axis(page)
    assert len(folded["lanes"]) == len(PINNED) + 16  # 16 bands of 8 rollout lanes
    assert_pinned_on_top(page, folded)

    # unfolded: all 128 rollout lanes, each in a legible row below the pinned ones (the chart grows)
    page.uncheck("#fold-lanes")
    page.wait_for_function(f"document.getElementById('gantt').layout.yaxis.categoryarray.length === {len(PINNED) + 128}")
    assert_pinned_on_top(page, lane_axis(page))

    # a zoom into rollout lanes 20-27 shows them in full rows, the pinned lanes still above them
    first = len(PINNED) + 20
    page.evaluate(f"Plotly.relayout('gantt', {{'yaxis.range': [{first + 7.4}, {first - 0.4}]}})")
    page.wait_for_function(f"document.getElementById('gantt').layout.yaxis.categoryarray.length === {len(PINNED) + 8}")
    zoomed = lane_axis(page)
    assert zoomed["lanes"][len(PINNED):] == [f"rollout/1/{s}" for s in range(4, 12)]
    assert_pinned_on_top(page, zoomed)

    # double-click (autorange) zooms back out: folded again, as before the zoom... of the unfolded view
    page.evaluate("Plotly.relayout('gantt', {'xaxis.autorange': true, 'yaxis.autorange': true})")
    page.wait_for_function(f"document.getElementById('gantt').layout.yaxis.categoryarray.length === {len(PINNED) + 128}")
    assert not page.is_checked("#fold-lanes")

    # from the folded view, a zoom into the first band unfolds its 8 lanes below the pinned ones
    page.check("#fold-lanes")
    page.wait_for_function(f"document.getElementById('gantt').layout.yaxis.categoryarray.length === {len(PINNED) + 16}")
    band = len(PINNED)
    page.evaluate(f"Plotly.relayout('gantt', {{'yaxis.range': [{band + 0.4}, {band - 0.4}]}})")
    page.wait_for_function(f"document.getElementById('gantt').layout.yaxis.categoryarray.length === {len(PINNED) + 8}")
    assert lane_axis(page)["lanes"][len(PINNED):] == [f"rollout/0/{s}" for s in range(8)]
    page.evaluate("Plotly.relayout('gantt', {'yaxis.autorange': true})")
    page.wait_for_function(f"document.getElementById('gantt').layout.yaxis.categoryarray.length === {len(PINNED) + 16}")
    assert page.is_checked("#fold-lanes")
    assert errors == []
