"""The curves people expect and every trajectory readable, in a real browser against the real app:
a real 3-step learner run (quickstart, streaming, KL to the reference on) whose event stream goes
through the real ingestion path (RunIngestor -> PostgreSQL), then the run page: the metric
panel lists and plots the learner's loss, entropy, KL, reward spread, response lengths and
per-process CPU / RSS; a clicked trajectory shows its decoded prompt, turns, tool calls and
observations, reward, advantage, group and what the learner did with it; the step's table sorts
by reward."""

import json

import pytest
from tests.harness.web_harness import browser_page, live_url, pick_metrics, screenshot  # noqa: F401 (fixtures)

from controller.ingest.ingestion import RunIngestor, finish_run
from controller.models import Run, Span, StepMetric, SystemSample, TrajectoryRecord
from learner.config import load_config
from learner.driver.loop import train
from learner.timeline import MemorySink

from .conftest import make_run
from .test_browser_insight import click_span, open_run_page

pytestmark = [pytest.mark.browser, pytest.mark.slow]
STEPS = 3


@pytest.fixture(scope="module")
def learner_events():
    # the processes sampled on the wall clock (tracking.system_every_s at its default: the interval
    # starts at 0.2 s and grows with the run) as well as at each step's end
    cfg = load_config("configs/quickstart.yaml", {"train.steps": STEPS, "algorithm.kl_coef": 0.05})
    sink = MemorySink()
    train(cfg, sink)
    return sink.events


@pytest.fixture
def run(alice_experiment, streaming_preset, learner_events):
    found = make_run(alice_experiment, streaming_preset, status=Run.Status.STARTING, steps=STEPS,
                     name="curves and texts")
    ingestor = RunIngestor(found.pk, flush_s=60.0, flush_spans=100_000)
    for event in learner_events:
        ingestor.feed(json.dumps(event))
    ingestor.flush()
    assert ingestor.rejected == [] and ingestor.finished
    return finish_run(found.pk, Run.Status.SUCCEEDED, summary=ingestor.summary)


def open_finished(page, live_url, run):
    open_run_page(page, live_url, run)
    page.wait_for_function(f"window.__thundersync.state().replayDone && window.__thundersync.state().stepsDone === {STEPS}")


def test_the_metric_panel_shows_the_learners_curves(live_url, browser_page, alice, run):
    page, errors = browser_page
    open_finished(page, live_url, run)
    listed = page.evaluate("[...document.querySelectorAll('#metric-picker label')].map((l) => l.dataset.metric)")
    for name in ("actor/pg_loss", "actor/entropy", "actor/kl_loss", "actor/lr", "actor/grad_norm", "reward/std",
                 "reward/min", "reward/max", "response_length/mean", "response_length/p90", "response_length/max",
                 "system/driver/cpu_percent", "system/driver/rss_mb", "system/rollout_0/cpu_percent",
                 "system/rollout_0/rss_mb"):
        assert name in listed, name
    page.fill("#metric-search", "entropy")
    shown = page.evaluate("[...document.querySelectorAll('#metric-picker label')].filter((l) => !l.hidden).map((l) => l.dataset.metric)")
    assert shown == ["actor/entropy"]
    # the process curves say whose they are: "learner rss" finds the driver's (the learner's) memory
    for words, found in (("learner rss", ["system/driver/rss_mb"]), ("rollout worker 0 cpu", ["system/rollout_0/cpu_percent"])):
        page.fill("#metric-search", words)
        shown = page.evaluate("[...document.querySelectorAll('#metric-picker label')].filter((l) => !l.hidden).map((l) => l.dataset.metric)")
        assert shown == found, (words, shown)
    assert page.inner_text("#metric-picker label[data-metric='system/driver/rss_mb'] .metric-role") == "driver / learner · RSS (MB)"
    # every process on one wall-clock chart, named by its role, its points the samples taken on the
    # wall clock: at least 10 over a run of 4 s or more (the adaptive interval, 0.2 s at first, not
    # one every tracking.system_every_s = 2 s), on the Gantt's time axis (seconds since run start)
    stored = [m.values for m in StepMetric.objects.filter(run=run).order_by("step")]
    run_end = max(v["step/t_end"] for v in stored)
    samples = list(SystemSample.objects.filter(run=run).order_by("t"))
    # counted from the first sample: the sampler starts once the run's processes are up, which on a
    # loaded machine is seconds into the run
    assert samples and len(samples) >= min(10, int((run_end - samples[0].t) / 0.2) - 2), (len(samples), run_end)
    for quantity in ("cpu_percent", "rss_mb"):
        key = f"system/driver/{quantity}"
        lines = process_lines(page, quantity)
        assert {"driver / learner", "rollout worker 0"} <= set(lines), list(lines)
        assert lines["driver / learner"]["y"] == pytest.approx([x.values[key] for x in samples if key in x.values])
        assert lines["driver / learner"]["x"] == pytest.approx([x.t for x in samples if key in x.values])
    axis_title = "document.getElementById('{}').layout.xaxis.title.text"
    assert page.evaluate(axis_title.format("chart-processes")) == page.evaluate(axis_title.format("gantt")) == "seconds since run start"
    page.locator("#chart-processes").scroll_into_view_if_needed()
    screenshot(page, "run-processes")
    stored = [m.values for m in StepMetric.objects.filter(run=run).order_by("step")]
    for name in ("actor/entropy", "actor/kl_loss", "system/rollout_0/rss_mb"):
        pick_metrics(page, [name])
        chart = f"#metric-charts [data-metric='{name}']"
        page.wait_for_function(f"document.querySelector(\"{chart}\")?.data?.[0]?.y?.length === {STEPS}")
        assert page.evaluate(f"document.querySelector(\"{chart}\").data[0].y") == pytest.approx([v[name] for v in stored])
    page.select_option("#metric-smoothing", "0.8")  # smoothing over the raw line, which stays
    chart = "#metric-charts [data-metric='system/rollout_0/rss_mb']"
    page.wait_for_function(f"document.querySelector(\"{chart}\").data.length === 2")
    page.fill("#metric-search", "")
    page.dispatch_event("#metric-search", "input")
    pick_metrics(page, ["actor/entropy", "actor/kl_loss", "response_length/p90", "system/driver/cpu_percent"])
    page.wait_for_function("document.querySelectorAll('#metric-charts [data-metric]').length === 4")
    page.locator("#metric-charts").scroll_into_view_if_needed()
    screenshot(page, "run-curves")
    assert errors == []


def process_lines(page, quantity: str) -> dict[str, dict]:
    """The Processes chart's lines for ``quantity``, by name, once it has drawn them."""
    processes = "document.getElementById('chart-processes')"
    page.select_option("#process-quantity", quantity)
    page.locator("#chart-processes").scroll_into_view_if_needed()
    page.wait_for_function(f"{processes}.layout?.uirevision === 'processes-{quantity}' && {processes}.data?.length >= 2")
    return {t["name"]: t for t in page.evaluate(f"{processes}.data.map((t) => ({{name: t.name, x: t.x, y: t.y}}))")}


def test_a_run_without_wall_clock_samples_draws_its_step_end_values(live_url, browser_page, alice, run):
    """``tracking.system_every_s: 0`` (or a run recorded before it existed): the chart falls back to
    the values each step's end recorded, at the step ends."""
    SystemSample.objects.filter(run=run).delete()
    page, errors = browser_page
    open_finished(page, live_url, run)
    stored = [m.values for m in StepMetric.objects.filter(run=run).order_by("step")]
    lines = process_lines(page, "rss_mb")
    assert lines["driver / learner"]["y"] == pytest.approx([v["system/driver/rss_mb"] for v in stored])
    assert lines["driver / learner"]["x"] == pytest.approx([v["step/t_end"] for v in stored])  # the run clock
    assert errors == []


def test_a_trajectory_reads_as_its_text_with_reward_advantage_and_what_was_learnt(live_url, browser_page, alice, run):
    page, errors = browser_page
    open_finished(page, live_url, run)
    records = {r.traj: r for r in TrajectoryRecord.objects.filter(run=run)}
    assert len(records) == 16 * STEPS
    # a trajectory with a tool call, followed from a bar of its longest turn
    rec = next(r for r in sorted(records.values(), key=lambda r: (-r.step, r.traj))
               if any(s.get("tool_call") for s in r.segments))
    generate = max(Span.objects.filter(run=run, traj=rec.traj, kind="rollout.generate"), key=lambda s: s.t1 - s.t0)
    click_span(page, generate)
    page.wait_for_function(f"document.getElementById('traj-text').dataset.traj === '{rec.traj}'")
    segs = page.evaluate("""[...document.querySelectorAll('#traj-text .traj-seg')].map((d) => ({
        role: d.dataset.role, toolCall: d.dataset.toolCall, text: d.querySelector('pre').textContent}))""")
    assert [(s["role"], s["text"]) for s in segs] == [(s["role"], s["text"]) for s in rec.segments]
    assert [s["toolCall"] == "1" for s in segs] == [bool(s.get("tool_call")) for s in rec.segments]
    assert "observation" in [s["role"] for s in segs]
    facts = page.evaluate("Object.fromEntries([...document.querySelectorAll('#traj-text [data-fact]')]"
                          ".map((s) => [s.dataset.fact, s.textContent]))")
    assert facts["reward"] == f"reward: {rec.reward:.3f}" and facts["advantage"] == f"advantage: {rec.advantage:.3f}"
    assert facts["group"] == f"group: {rec.group}"
    trained = Span.objects.filter(run=run, traj=rec.traj, kind="learner.backward").exists()
    assert trained == (not rec.zero_gradient)
    assert facts["learner"].startswith("learner: learnt" if trained else "learner: skipped: advantage 0")
    # a zero-advantage one says why it was skipped
    skipped = next((r for r in records.values() if r.zero_gradient and r.step == rec.step), None)
    if skipped is not None:
        page.fill("#traj-search", str(skipped.traj))
        page.dispatch_event("#traj-search", "change")
        page.wait_for_function(f"document.getElementById('traj-text').dataset.traj === '{skipped.traj}'")
        assert "every reward in group" in page.inner_text("#traj-text [data-fact='learner']")
    # the step's trajectories as a table, sorted by reward, a row click follows that trajectory
    page.select_option("#lane-mode", "traj")
    page.select_option("#traj-step", str(rec.step))
    page.wait_for_function("[...document.querySelectorAll('#traj-table td[data-key=reward]')].length === 16"
                           " && [...document.querySelectorAll('#traj-table td[data-key=reward]')].every((td) => td.textContent !== '—')")
    page.click("#traj-table th[data-key=reward]")
    shown = page.evaluate("[...document.querySelectorAll('#traj-table td[data-key=reward]')].map((td) => Number(td.textContent))")
    step_rewards = sorted(round(r.reward, 3) for r in records.values() if r.step == rec.step)
    assert shown == step_rewards
    first = page.get_attribute("#traj-table tbody tr", "data-traj")
    page.click("#traj-table tbody tr")
    page.wait_for_function(f"document.getElementById('traj-text').dataset.traj === '{first}'")
    page.click("#traj-table tbody tr")  # the same row again: the text stays
    page.locator("#traj-text").scroll_into_view_if_needed()
    screenshot(page, "run-trajectory-text")
    assert errors == []
