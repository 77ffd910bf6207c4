"""Charts drawn only while on screen (static/js/onscreen.js), in a real browser against the real
app: on a short viewport the run page's charts below the fold wait undrawn while the Gantt
draws, and each draws its data once scrolled into view, the fixed charts and the every-metric
panel's alike; a chart drawn that way downloads as SVG and PNG with its data."""

import io

import pytest
from PIL import Image
from tests.harness.web_harness import browser_page, live_url  # noqa: F401 (fixtures)

from controller.models import StepMetric

from .conftest import make_run
from .test_browser_gantt_figures import download, modebar_button
from .test_browser_insight import open_run_page, store_workload

pytestmark = pytest.mark.browser
WAITING = "window.__thundersync.waitingCharts()"


@pytest.fixture
def run(alice_experiment, streaming_preset):
    found = make_run(alice_experiment, streaming_preset, steps=4, name="on screen")
    store_workload(found, seed=5, boot_s=2.0)
    return found


def test_charts_below_the_fold_draw_when_scrolled_into_view(live_url, browser_page, alice, run):
    page, errors = browser_page
    page.set_viewport_size({"width": 1400, "height": 500})  # the charts start below the fold
    open_run_page(page, live_url, run)
    stored = [m.values for m in StepMetric.objects.filter(run=run).order_by("step")]
    page.wait_for_function("window.__thundersync.state().chartsDrawnMs !== null", timeout=30_000)
    # the picker is built from every metric, the charts out of view are not drawn
    page.evaluate("""() => {
        for (const box of document.querySelectorAll('#metric-picker input')) box.checked = box.value === 'timing_s/tail';
        document.getElementById('metric-picker').dispatchEvent(new Event('change'));
    }""")
    panel_chart = "#metric-charts [data-metric='timing_s/tail']"
    page.wait_for_selector(panel_chart, state="attached")
    page.wait_for_function(f"{WAITING}.includes('timing_s/tail')")
    waiting = page.evaluate(WAITING)
    assert "chart-staleness" in waiting and "chart-reward" in waiting, waiting
    assert page.locator("#chart-staleness .main-svg").count() == 0
    assert page.locator(f"{panel_chart} .main-svg").count() == 0
    assert int(page.get_attribute("#gantt", "data-drawn-spans")) > 0  # the Gantt, on screen, drew

    page.locator("#chart-staleness").scroll_into_view_if_needed()
    page.wait_for_function("document.getElementById('chart-staleness').data?.[0]?.y?.length > 0")
    assert page.evaluate("document.getElementById('chart-staleness').data[0].y") == pytest.approx(
        [v["staleness/mean"] for v in stored])
    assert "chart-staleness" not in page.evaluate(WAITING)
    page.hover("#chart-staleness")
    svg = download(page, modebar_button("#chart-staleness", "Download SVG")).decode()
    assert svg.startswith("<svg") and svg.count('class="point"') >= len(stored)  # one marker per step
    png = Image.open(io.BytesIO(download(page, modebar_button("#chart-staleness", "Download PNG"))))
    assert png.size[0] > 400

    page.locator(panel_chart).scroll_into_view_if_needed()
    page.wait_for_function(f"document.querySelector(\"{panel_chart}\")?.data?.[0]?.y?.length === {len(stored)}")
    assert page.evaluate(f"document.querySelector(\"{panel_chart}\").data[0].y") == pytest.approx(
        [v["timing_s/tail"] for v in stored])
    assert "timing_s/tail" not in page.evaluate(WAITING)
    assert errors == []
