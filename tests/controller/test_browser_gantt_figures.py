"""Figures out and lanes at scale, in a real browser against the real app: the Gantt's PNG and
SVG downloads hold its bars (painted on a canvas, not by plotly), every other chart downloads
both too, and with 128 rollout lanes the learner lane stays labelled and readable: the
rollout lanes fold into bands below it and a zoom into the bands unfolds them below it
(tests/controller/test_browser_lanes_pinned.py: replicas and ranks, unfolded, zoomed)."""

import io
import re

import pytest
from PIL import Image
from tests.harness.web_harness import agent_run_events, browser_page, live_url  # noqa: F401 (fixtures)

from controller.models import Span, StepMetric

from .conftest import make_run
from .test_browser_insight import open_run_page, store_workload

pytestmark = pytest.mark.browser
BACKWARD_RGB = (0xe1, 0x57, 0x59)  # static/js/spans.js: learner.backward


@pytest.fixture
def run(alice_experiment, streaming_preset):
    found = make_run(alice_experiment, streaming_preset, steps=4, name="figures")
    store_workload(found, seed=8, boot_s=2.0)
    return found


def download(page, selector: str) -> bytes:
    with page.expect_download(timeout=30_000) as info:
        page.click(selector)
    return open(info.value.path(), "rb").read()


def modebar_button(chart: str, title: str) -> str:
    return f"{chart} .modebar-btn[data-title='{title}']"


def test_the_gantt_downloads_png_and_svg_with_its_bars(live_url, browser_page, alice, run):
    """Before the fix: the camera button saved axes and legend but no bars."""
    page, errors = browser_page
    open_run_page(page, live_url, run)
    page.hover("#gantt")
    # every bar on screen: the chart has grown to every lane (a download paints what is shown)
    page.wait_for_function("Object.entries(window.__thundersync.barsByKind()).every("
                           "([kind, n]) => window.__thundersync.shownByKind()[kind] === n)", timeout=30_000)
    assert page.locator(modebar_button("#gantt", "Download plot as a png")).count() == 0  # plotly's own: no bars
    png = Image.open(io.BytesIO(download(page, modebar_button("#gantt", "Download PNG")))).convert("RGB")
    backward = sum(1 for p in png.get_flattened_data() if p == BACKWARD_RGB)
    assert backward > 200, f"{backward} pixels of learner.backward's colour"

    svg = download(page, modebar_button("#gantt", "Download SVG")).decode()
    painted = page.evaluate("window.__thundersync.barsByKind()")
    for kind, bars in painted.items():
        paths = re.findall(rf'<path d="([^"]*)" fill="[^"]+"[^>]*data-kind="{re.escape(kind)}"', svg)
        assert sum(p.count("M") for p in paths) == bars, kind
    assert 'class="gantt-bars"' in svg and "learner/0" in svg
    assert errors == []


def test_every_chart_downloads_png_and_svg(live_url, browser_page, alice, run):
    page, errors = browser_page
    open_run_page(page, live_url, run)
    page.locator("#chart-step-time").scroll_into_view_if_needed()  # charts draw on screen only
    page.wait_for_function("document.getElementById('chart-step-time').data?.length > 0")
    page.hover("#chart-step-time")
    svg = download(page, modebar_button("#chart-step-time", "Download SVG")).decode()
    steps = StepMetric.objects.filter(run=run).count()
    assert svg.startswith("<svg") and svg.count('class="point"') == steps  # one bar per step
    png = Image.open(io.BytesIO(download(page, modebar_button("#chart-step-time", "Download PNG"))))
    assert png.size[0] > 400
    assert errors == []


@pytest.fixture
def wide_run(alice_experiment, streaming_preset):
    """128 rollout lanes (8 workers x 16 slots), two learner ranks."""
    found = make_run(alice_experiment, streaming_preset, steps=2, name="128 lanes")
    spans, metrics = agent_run_events(2, groups=32, group_size=4, workers=8, slots=16, max_turns=2, seed=3)
    keys = ("seq", "step", "kind", "lane", "traj", "group", "turn", "policy_version", "tokens", "t0", "t1")
    Span.objects.bulk_create([Span(run=found, **{k: e[k] for k in keys}) for e in spans])
    StepMetric.objects.bulk_create([StepMetric(run=found, step=m["step"], values=m["values"]) for m in metrics])
    return found


def test_the_learner_lane_stays_labelled_and_readable_at_128_rollout_lanes(live_url, browser_page, alice, wide_run):
    """Before the fix: at 128 lanes each was ~3 px, learner/0 lost its label and became a 1-px line."""
    page, errors = browser_page
    open_run_page(page, live_url, wide_run)
    assert Span.objects.filter(run=wide_run).values("lane").distinct().count() == 129
    axis = page.evaluate("(() => { const ya = document.getElementById('gantt')._fullLayout.yaxis;"
                         " return {lanes: ya.categoryarray, ticks: ya.tickvals, px: ya._length / Math.abs(ya.range[0] - ya.range[1])}; })()")
    assert axis["lanes"][0] == "learner/0" and len(axis["lanes"]) == 17  # learner/0 + 16 bands of 8 lanes
    assert axis["lanes"][1] == "rollout/0/0…0/7 ×8" and axis["ticks"] == axis["lanes"]
    assert axis["px"] >= 12
    labels = page.evaluate("[...document.querySelectorAll('#gantt .ytick text')].map((t) => t.textContent)")
    assert "learner/0" in labels
    assert page.is_visible("#fold-lanes")

    # a zoom into the first two bands unfolds their 16 lanes, learner/0 still pinned above them
    page.evaluate("Plotly.relayout('gantt', {'yaxis.range': [2.4, 0.6]})")
    # (folded there are 17 rows too, learner/0 + 16 bands: wait for the unfolded lanes themselves, or
    # a loaded machine reads the rows before the zoom's redraw)
    unfolded = ["learner/0", *(f"rollout/0/{s}" for s in range(16))]
    page.wait_for_function("(want) => JSON.stringify(document.getElementById('gantt')._fullLayout.yaxis.categoryarray)"
                           " === JSON.stringify(want)", arg=unfolded, timeout=60_000)
    shown = page.evaluate("document.getElementById('gantt')._fullLayout.yaxis.categoryarray")
    assert shown == unfolded
    assert not page.is_checked("#fold-lanes")
    assert errors == []


def test_the_modebar_names_its_downloads_by_run_and_has_no_selection_or_sharing(live_url, browser_page, alice, run):
    page, errors = browser_page
    open_run_page(page, live_url, run)
    page.hover("#gantt")
    page.wait_for_selector(modebar_button("#gantt", "Download SVG"), timeout=30_000)
    for title in ("Lasso Select", "Box Select", "Edit in Chart Studio", "Download plot as a png"):
        assert page.locator(modebar_button("#gantt", title)).count() == 0, title
    assert page.locator("#gantt a.modebar-btn[href], #gantt .js-plot-link-container").count() == 0  # no share link
    icons = [page.inner_html(modebar_button("#gantt", f"Download {f}")) for f in ("PNG", "SVG")]
    assert icons[0] != icons[1]  # two buttons that look alike no more
    with page.expect_download(timeout=30_000) as info:
        page.click(modebar_button("#gantt", "Download PNG"))
    # the run, the chart and the shown time range (seconds): two runs' or two zooms' files never collide
    assert re.fullmatch(rf"run-{run.pk}-gantt-t[\d.]+-[\d.]+\.png", info.value.suggested_filename), \
        info.value.suggested_filename
    assert errors == []
