"""Compare summary, trajectory highlight, by-trajectory lanes, metric picker and trace range in
a real browser (Debian's chromium) against the real app (daphne, PostgreSQL, Redis), on runs
stored from a run-shaped workload (tests.harness.web_harness.agent_run_events: a multi-turn tool
agent's spans, metrics from learner.timeline.window_metrics)."""

import statistics

import pytest
from tests.harness.web_harness import (  # noqa: F401 (fixtures)
    agent_run_events, browser_page, live_url, log_in, pick_metrics, screenshot)
from django.test import Client

from controller.models import Span, StepMetric

from .conftest import make_run

pytestmark = pytest.mark.browser

BOOT_S = {"sync": 20.0, "streaming": 7.0}  # learner clock at the first step's start: boot differs per run
FIELDS = ("steps_done", "step_s", "speedup_vs_sync", "efficiency", "learner_idle", "rollout_idle",
          "staleness_mean", "staleness_max", "tail_s", "final_reward", "time_to_reward_s")


def store_workload(run, seed: int, boot_s: float, steps: int = 4) -> None:
    spans, metrics = agent_run_events(steps, groups=3, group_size=4, workers=2, slots=3, max_turns=4, seed=seed,
                                      learn_after_rollout=run.schedule.kind == "sync")
    keys = ("seq", "step", "kind", "lane", "traj", "group", "turn", "policy_version", "tokens")
    for e in spans:  # two learner ranks: odd trajectories' backward passes run on rank 1
        if e["kind"] == "learner.backward" and e["traj"] % 2:
            e["lane"] = "learner/1"
    Span.objects.bulk_create([Span(run=run, t0=e["t0"] + boot_s, t1=e["t1"] + boot_s, **{k: e[k] for k in keys})
                              for e in spans])
    for m in metrics:
        values = {k: (v + boot_s if k.startswith("step/") else v) for k, v in m["values"].items()}  # clock times
        StepMetric.objects.create(run=run, step=m["step"], values=values)


@pytest.fixture
def two_runs(alice_experiment, sync_preset, streaming_preset):
    sync = make_run(alice_experiment, sync_preset, steps=4, name="sync run")
    streaming = make_run(alice_experiment, streaming_preset, steps=4, name="streaming run")
    store_workload(sync, seed=1, boot_s=BOOT_S["sync"])
    store_workload(streaming, seed=2, boot_s=BOOT_S["streaming"])
    return sync, streaming


def api(user, path):
    client = Client()
    client.force_login(user)
    return client.get(path).json()


def summary_cells(page) -> dict:
    """{run id: {field: float or None}} as the page's summary table holds them."""
    return page.evaluate("""() => Object.fromEntries([...document.querySelectorAll('#compare-summary tbody tr')].map(
        (tr) => [tr.dataset.runId, Object.fromEntries([...tr.querySelectorAll('td[data-field]')].map(
            (td) => [td.dataset.field, td.dataset.value === '' ? null : Number(td.dataset.value)]))]))""")


def test_compare_summary_equals_the_api_and_the_stored_metrics(live_url, browser_page, alice, two_runs):
    page, errors = browser_page
    sync, streaming = two_runs
    log_in(page, live_url, "alice", "alice-password")
    page.goto(f"{live_url}/compare/?runs={streaming.pk},{sync.pk}")
    page.wait_for_selector("#compare-app[data-ready='1']", timeout=60_000)
    body = api(alice, f"/api/compare/?runs={streaming.pk},{sync.pk}")
    cells = summary_cells(page)
    for run in body["runs"]:
        assert cells[str(run["id"])] == {f: run[f] for f in FIELDS}
    # ... and the API's figures are the stored metrics'
    for run in (sync, streaming):
        stored = [m.values for m in StepMetric.objects.filter(run=run).order_by("step")]
        row = cells[str(run.pk)]
        assert row["step_s"] == pytest.approx(statistics.median(v["timing_s/step"] for v in stored))
        assert row["final_reward"] == pytest.approx(stored[-1]["reward/mean"])
        assert row["tail_s"] == pytest.approx(statistics.median(v["timing_s/tail"] for v in stored))
    assert cells[str(sync.pk)]["speedup_vs_sync"] == 1.0
    # efficiency: each run's own bound (the bench's, over its stored spans), at most 100% for each
    for run in (sync, streaming):
        figures = next(r for r in body["runs"] if r["id"] == run.pk)
        assert cells[str(run.pk)]["efficiency"] == pytest.approx(figures["bound_s"] / figures["step_mean_s"])
        assert 0 < cells[str(run.pk)]["efficiency"] <= 1
    assert "each run's own bound" in page.inner_text("#summary-note")
    assert "(reference)" in page.inner_text(f"#compare-summary tr[data-run-id='{sync.pk}']")

    # Time to reward counts from the first step's start: boot (20 s vs 7 s) is not in the chart.
    reward = page.evaluate("document.getElementById('chart-reward').data.map((t) => t.x[0])")
    for run, first_x in zip((streaming, streaming, sync, sync), reward):  # per run: raw, then smoothed
        first = StepMetric.objects.get(run=run, step=0).values
        assert first_x == pytest.approx(first["step/t_end"] - first["step/t_start"])

    # A chosen reward level: the column follows it and matches the API's answer for it.
    level = min(m.values["reward/mean"] for m in StepMetric.objects.filter(run=sync)) + 1e-6
    page.fill("#reward-level", str(level))
    page.dispatch_event("#reward-level", "change")
    page.wait_for_function(f"document.getElementById('compare-summary').dataset.rewardLevel === '{level}'")
    chosen = api(alice, f"/api/compare/?runs={streaming.pk},{sync.pk}&reward={level}")
    cells = summary_cells(page)
    for run in chosen["runs"]:
        assert cells[str(run["id"])]["time_to_reward_s"] == run["time_to_reward_s"]
    screenshot(page, "compare-summary")
    assert errors == []


def test_aligned_timelines_keep_rollouts_that_ran_before_the_step_start(live_url, browser_page, alice, two_runs):
    """Off-policy: the batch of a step rolled out while the previous step trained. Its spans
    sit before the step's start, at negative times, instead of being cut off at 0."""
    page, errors = browser_page
    sync, streaming = two_runs
    last = StepMetric.objects.filter(run=streaming).order_by("-step").first()
    first_rollout = Span.objects.filter(run=streaming, step=last.step, kind="rollout.generate").order_by("t0").first()
    last.values["step/t_start"] = first_rollout.t0 + 0.3  # the step began 0.3 s after its first rollout
    last.save()
    log_in(page, live_url, "alice", "alice-password")
    page.goto(f"{live_url}/compare/?runs={streaming.pk},{sync.pk}")
    page.wait_for_selector("#compare-app[data-ready='1']", timeout=60_000)
    x_lo = page.evaluate(f"document.getElementById('timeline-{streaming.pk}').layout.xaxis.range[0]")
    assert x_lo <= -0.3
    assert errors == []


def click_span(page, span, lane: str | None = None) -> None:
    """Clicks the middle of ``span``'s bar (on ``lane``, default its own) in the run page's
    Gantt: plotly's axes map time and lane to pixels."""
    point = page.evaluate("""([t, lane]) => {
        const gd = document.getElementById('gantt'), xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
        const box = gd.querySelector('canvas.gantt-bars').getBoundingClientRect();
        return [box.left + xa.l2p(t), box.top + ya.l2p(ya.d2l(lane))];
    }""", [(span.t0 + span.t1) / 2, lane or span.lane])
    page.mouse.click(*point)


def detail_rows(page) -> list[dict]:
    return page.evaluate("[...document.querySelectorAll('#traj-detail tbody tr')].map((tr) => ({...tr.dataset}))")


def open_run_page(page, live_url, run) -> None:
    log_in(page, live_url, "alice", "alice-password")
    page.goto(f"{live_url}/runs/{run.pk}/")
    total = Span.objects.filter(run=run).count()
    page.select_option("#window-steps", "0")
    page.wait_for_function(f"document.getElementById('gantt').dataset.drawnSpans === '{total}'", timeout=60_000)


def test_a_clicked_rollout_highlights_its_own_backward_and_group_close(live_url, browser_page, alice, two_runs):
    page, errors = browser_page
    _, run = two_runs
    open_run_page(page, live_url, run)
    # a long generate span of the last step, to click on
    target = max(Span.objects.filter(run=run, step=3, kind="rollout.generate"), key=lambda s: s.t1 - s.t0)
    click_span(page, target)
    page.wait_for_function(f"document.getElementById('traj-detail').dataset.traj === '{target.traj}'")
    # a lane per learner rank, above the rollout slots
    assert page.evaluate("document.getElementById('gantt').layout.yaxis.categoryarray.slice(0, 3)") == [
        "learner/0", "learner/1", "rollout/0/0"]
    rows = detail_rows(page)
    backward = [r for r in rows if r["kind"] == "learner.backward"]
    assert len(backward) == 1 and backward[0]["traj"] == str(target.traj)
    expected = set(Span.objects.filter(run=run, traj=target.traj).values_list("seq", flat=True))
    expected |= set(Span.objects.filter(run=run, kind="learner.group_close", group=target.group)
                    .values_list("seq", flat=True))
    assert {int(r["seq"]) for r in rows} == expected
    assert f"backward on learner/{target.traj % 2}" in page.inner_text("#traj-note")
    screenshot(page, "run-trajectory")

    # The search box follows another trajectory.
    other = Span.objects.filter(run=run, step=1, kind="learner.backward").first().traj
    page.fill("#traj-search", str(other))
    page.dispatch_event("#traj-search", "change")
    page.wait_for_function(f"document.getElementById('traj-detail').dataset.traj === '{other}'")
    assert {r["traj"] for r in detail_rows(page) if r["kind"] != "learner.group_close"} == {str(other)}
    assert errors == []


def test_by_trajectory_mode_puts_each_trajectory_on_its_own_row(live_url, browser_page, alice, two_runs):
    page, errors = browser_page
    _, run = two_runs
    open_run_page(page, live_url, run)
    page.select_option("#lane-mode", "traj")
    page.select_option("#traj-step", "2")
    trajs = sorted(Span.objects.filter(run=run, step=2, kind="learner.backward").values_list("traj", flat=True))
    expected_lanes = ["learner/0", *[f"traj {t}" for t in trajs]]
    page.wait_for_function("(lanes) => JSON.stringify(document.getElementById('gantt').layout.yaxis.categoryarray)"
                           " === JSON.stringify(lanes)", arg=expected_lanes, timeout=30_000)
    # every span of those trajectories, plus the step's other learner spans, is drawn
    expected = Span.objects.filter(run=run, traj__in=trajs).count() + Span.objects.filter(
        run=run, step=2, traj__isnull=True, lane__startswith="learner").count()
    page.wait_for_function(f"document.getElementById('gantt').dataset.drawnSpans === '{expected}'")
    screenshot(page, "run-by-trajectory")
    # a rollout bar and its backward are on the same row: clicking one lists both
    target = Span.objects.filter(run=run, traj=trajs[0], kind="rollout.verify").first()
    click_span(page, target, lane=f"traj {trajs[0]}")
    page.wait_for_function(f"document.getElementById('traj-detail').dataset.traj === '{trajs[0]}'")
    assert {r["kind"] for r in detail_rows(page)} >= {"rollout.generate", "rollout.verify", "learner.backward"}
    assert errors == []


def test_metric_picker_smoothing_and_wall_time_axis(live_url, browser_page, alice, two_runs):
    page, errors = browser_page
    sync, run = two_runs
    open_run_page(page, live_url, run)
    stored = [m.values for m in StepMetric.objects.filter(run=run).order_by("step")]
    names = sorted({k for v in stored for k in v})
    assert page.evaluate("[...document.querySelectorAll('#metric-picker input')].map((o) => o.value)") == names
    pick_metrics(page, ["timing_s/tail", "trainer/idle_ratio"])
    chart = "#metric-charts [data-metric='timing_s/tail']"
    page.wait_for_function(f"document.querySelector(\"{chart}\")?.data?.[0]?.y?.length === {len(stored)}")
    assert page.evaluate(f"document.querySelector(\"{chart}\").data[0].y") == pytest.approx(
        [v["timing_s/tail"] for v in stored])
    assert page.locator("#metric-charts .chart").count() == 2

    page.select_option("#metric-smoothing", "0.5")
    page.select_option("#metric-axis", "wall")
    page.wait_for_function(f"document.querySelector(\"{chart}\").layout.xaxis.title.text.startsWith('seconds')")
    smoothed, avg = [], None
    for v in stored:
        avg = v["timing_s/tail"] if avg is None else 0.5 * avg + 0.5 * v["timing_s/tail"]
        smoothed.append(avg)
    raw, trace = page.evaluate(f"document.querySelector(\"{chart}\").data")  # smoothing overlays the raw line
    assert raw["y"] == pytest.approx([v["timing_s/tail"] for v in stored])
    assert trace["y"] == pytest.approx(smoothed)
    assert trace["x"] == pytest.approx([v["step/t_end"] - stored[0]["step/t_start"] for v in stored])

    # The compare page overlays the runs, one line per run.
    page.goto(f"{live_url}/compare/?runs={run.pk},{sync.pk}")
    page.wait_for_selector("#compare-app[data-ready='1']", timeout=60_000)
    pick_metrics(page, ["reward/mean"])
    page.wait_for_function("document.querySelector(\"#metric-charts [data-metric='reward/mean']\")?.data?.length === 2")
    assert errors == []


def test_the_trace_link_carries_the_chosen_step_range(live_url, browser_page, alice, two_runs):
    page, errors = browser_page
    _, run = two_runs
    open_run_page(page, live_url, run)
    page.fill("#trace-from", "1")
    page.fill("#trace-to", "2")
    href = page.get_attribute("#trace-link", "href")
    assert href == f"/api/runs/{run.pk}/trace.json?step_from=1&step_to=2"
    trace = page.request.get(f"{live_url}{href}").json()
    steps = {e["args"]["step"] for e in trace["traceEvents"] if e.get("ph") == "X"}
    assert steps == {1, 2}
    assert errors == []
