"""Rough edges of the run and compare pages, each in its scenario, in a real browser against the
real app: barrier labels that overlapped ("step 12 step 13 step 14"), a bar count that named 18
lanes for 256 folded ones, the time-to-reward legend covering its plot, and the compare summary
overflowing its panel at 1024 px."""

import pytest
from tests.harness.web_harness import agent_run_events, browser_page, live_url, log_in  # noqa: F401 (fixtures)

from controller.management.commands.demo import ensure_demos, ensure_presets
from controller.models import Comparison, Run, Span, StepMetric

from .conftest import make_run
from .test_browser_insight import open_run_page, store_workload

pytestmark = pytest.mark.browser

# every barrier label's box on screen, and the barrier lines plotly drew
LABELS = """(() => [...document.querySelectorAll('#gantt .annotation')].map((a) => {
  const r = a.getBoundingClientRect(); return {text: a.textContent, left: r.left, right: r.right};
}).filter((a) => a.text.startsWith('step ')).sort((a, b) => a.left - b.left))()"""


def test_barrier_labels_are_thinned_to_the_pixels_and_never_overlap(live_url, browser_page, alice, alice_experiment,
                                                                   streaming_preset):
    page, errors = browser_page
    page.set_viewport_size({"width": 1024, "height": 900})
    run = make_run(alice_experiment, streaming_preset, steps=40, name="forty steps")
    store_workload(run, seed=3, boot_s=1.0, steps=40)
    open_run_page(page, live_url, run)  # "all steps": 40 barriers on ~800 px
    labels = page.evaluate(LABELS)
    lines = page.evaluate("document.getElementById('gantt').layout.shapes.length")
    assert lines == 40  # every barrier keeps its dashed line
    assert 3 <= len(labels) < 40, [a["text"] for a in labels]
    for a, b in zip(labels, labels[1:]):
        assert a["right"] <= b["left"], f"{a['text']!r} overlaps {b['text']!r}"
    assert labels[-1]["text"] == "step 39"  # the newest step is always labelled
    # the last 3 steps: room for each label
    page.select_option("#window-steps", "3")
    page.wait_for_function("document.getElementById('gantt').layout.xaxis.range[0] > 10")
    page.wait_for_timeout(300)
    shown = [a["text"] for a in page.evaluate(LABELS)]
    assert {"step 37", "step 38", "step 39"} <= set(shown), shown
    assert errors == []


def test_the_bar_count_says_lanes_are_folded_into_bands(live_url, browser_page, alice, alice_experiment,
                                                       streaming_preset):
    page, errors = browser_page
    run = make_run(alice_experiment, streaming_preset, steps=2, name="256 rollout lanes")
    spans, metrics = agent_run_events(2, groups=64, group_size=4, workers=32, slots=8, max_turns=1, seed=7)
    keys = ("seq", "step", "kind", "lane", "traj", "group", "turn", "policy_version", "tokens", "t0", "t1")
    Span.objects.bulk_create([Span(run=run, **{k: e[k] for k in keys}) for e in spans])
    StepMetric.objects.bulk_create([StepMetric(run=run, step=m["step"], values=m["values"]) for m in metrics])
    open_run_page(page, live_url, run)
    hint = page.inner_text("#bars-hint")
    bands = page.evaluate("document.getElementById('gantt').layout.yaxis.categoryarray.length") - 1  # less learner/0
    rollout = len({e["lane"] for e in spans if e["lane"].startswith("rollout/")})
    assert rollout == 256
    assert f"{rollout} rollout lanes folded into {bands} bands" in hint, hint
    page.uncheck("#fold-lanes")
    page.wait_for_function("document.getElementById('gantt').layout.yaxis.categoryarray.length === 257")
    assert page.inner_text("#bars-hint").endswith("on 257 lanes")
    assert errors == []


def test_compare_page_at_1024_px_legend_below_the_plot_and_the_summary_inside_its_panel(live_url, browser_page,
                                                                                        alice):
    page, errors = browser_page
    page.set_viewport_size({"width": 1024, "height": 900})
    ensure_presets()
    experiment = ensure_demos(alice)[0]
    log_in(page, live_url, "alice", "alice-password")
    page.goto(f"{live_url}/experiments/{experiment.pk}/")
    page.fill("#comparison-form input[name=steps]", "3")
    page.click("#comparison-form button[type=submit]")
    page.wait_for_url(f"{live_url}/comparisons/*/")
    comparison = Comparison.objects.get(pk=int(page.url.rstrip("/").rsplit("/", 1)[1]))
    for k, run in enumerate(comparison.runs.order_by("id")):
        store_workload(run, seed=k, boot_s=2.0 + k, steps=3)
        Run.objects.filter(pk=run.pk).update(status=Run.Status.SUCCEEDED)
    page.wait_for_selector("#compare-app[data-live='0']", timeout=60_000)
    page.wait_for_function("document.getElementById('chart-reward').data?.length === 16", timeout=30_000)
    box = page.evaluate("""(() => {
      const chart = document.getElementById('chart-reward');
      const legend = chart.querySelector('.legend').getBoundingClientRect();
      const plot = chart.querySelector('.nsewdrag').getBoundingClientRect();
      return {legendTop: legend.top, legendBottom: legend.bottom, plotTop: plot.top, plotBottom: plot.bottom,
              plotHeight: plot.height, entries: chart.querySelectorAll('.legend .traces').length};
    })()""")
    assert box["entries"] == 8  # one per run: its raw line shares the entry
    assert box["legendTop"] >= box["plotBottom"], box  # below the plot, none of it covered
    assert box["plotHeight"] >= 150, box
    table = page.evaluate("""(() => {
      const panel = document.getElementById('compare-summary').closest('.panel').getBoundingClientRect();
      const wrap = document.getElementById('compare-summary').parentElement, w = wrap.getBoundingClientRect();
      return {panelRight: panel.right, wrapRight: w.right, scrolls: getComputedStyle(wrap).overflowX,
              rows: document.querySelectorAll('#compare-summary tbody tr').length,
              pageScroll: document.documentElement.scrollWidth, viewport: window.innerWidth,
              wide: [...document.querySelectorAll('body *')].filter((e) => !e.closest('.table-scroll') && e.getBoundingClientRect().right > window.innerWidth + 0.5)
                .slice(0, 6).map((e) => `${e.tagName}#${e.id}.${e.className}`)};
    })()""")
    assert table["rows"] == 8
    assert table["wrapRight"] <= table["panelRight"] + 0.5 and table["scrolls"] == "auto", table
    assert table["pageScroll"] <= table["viewport"], table["wide"]  # nothing pushes the page sideways
    assert errors == []
