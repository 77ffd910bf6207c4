"""The run page's defects, each in its scenario, in a real browser against the real app, on a
run stored from a run-shaped workload (tests.harness.web_harness.agent_run_events) in which one
group of step 2 was skipped as zero-variance (no backward, learner/skipped_trajectories = 4)."""

import pytest
from tests.harness.web_harness import browser_page, live_url, log_in, pick_metrics  # noqa: F401 (fixtures)
from django.utils import timezone

from controller.models import Run, Span, StepMetric

from .conftest import make_run
from .test_browser_insight import click_span, open_run_page, store_workload

pytestmark = pytest.mark.browser
STATE = "window.__thundersync.state()"
SKIPPED_STEP = 2


@pytest.fixture
def run(alice_experiment, streaming_preset):
    found = make_run(alice_experiment, streaming_preset, steps=4, name="skips a group")
    store_workload(found, seed=5, boot_s=3.0)
    group = Span.objects.filter(run=found, step=SKIPPED_STEP, kind="learner.backward").order_by("seq").first().group
    Span.objects.filter(run=found, kind="learner.backward", group=group).delete()
    metric = StepMetric.objects.get(run=found, step=SKIPPED_STEP)
    metric.values["learner/skipped_trajectories"] = 4.0
    metric.save()
    found.skipped_group = group
    return found


def skipped_trajs(run) -> list[int]:
    return sorted(set(Span.objects.filter(run=run, group=run.skipped_group, kind="rollout.verify")
                      .values_list("traj", flat=True)))


def point_of(page, span, lane=None, t=None) -> list[float]:
    return page.evaluate("""([t, lane]) => {
        const gd = document.getElementById('gantt'), xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
        const box = gd.querySelector('canvas.gantt-bars').getBoundingClientRect();
        return [box.left + xa.l2p(t), box.top + ya.l2p(ya.d2l(lane))];
    }""", [(span.t0 + span.t1) / 2 if t is None else t, lane or span.lane])


def open_finished(page, live_url, run):
    open_run_page(page, live_url, run)  # all steps drawn
    page.wait_for_function(f"{STATE}.replayDone && {STATE}.stepsDone === 4")


def test_a_skipped_trajectory_says_why_it_has_no_backward(live_url, browser_page, alice, run):
    """Before the fix: a zero-variance trajectory said "not trained yet" on a finished run."""
    page, errors = browser_page
    open_finished(page, live_url, run)
    traj = skipped_trajs(run)[0]
    # its longest generate span: a bar wide enough to hit under load
    generate = max(Span.objects.filter(run=run, traj=traj, kind="rollout.generate"), key=lambda s: s.t1 - s.t0)
    click_span(page, generate)
    page.wait_for_function(f"document.getElementById('traj-detail').dataset.traj === '{traj}'")
    note = page.inner_text("#traj-note")
    assert "not trained yet" not in note
    assert "skipped: no backward, its group's rewards were all equal so its advantage is 0" in note
    assert f"4 trajectories skipped in step {SKIPPED_STEP}" in note
    assert page.get_attribute("#traj-note", "data-state") == "skipped"
    # a trained one says where its backward ran
    trained = Span.objects.filter(run=run, step=SKIPPED_STEP, kind="learner.backward").first()
    page.fill("#traj-search", str(trained.traj))
    page.dispatch_event("#traj-search", "change")
    page.wait_for_function("document.getElementById('traj-note').dataset.state === 'trained'")
    assert errors == []


def test_by_trajectory_keeps_skipped_rows_and_the_chart_is_honest(live_url, browser_page, alice, run):
    """Before the fix: skipped trajectories hidden, a dimmed chart with nothing highlighted, a stale
    tooltip, a blank band below the chart."""
    page, errors = browser_page
    open_finished(page, live_url, run)
    page.select_option("#lane-mode", "traj")
    page.select_option("#traj-step", str(SKIPPED_STEP))
    skipped = skipped_trajs(run)
    page.wait_for_function("(n) => document.getElementById('gantt').layout.yaxis.categoryarray"
                           ".filter((l) => l.endsWith('· skipped')).length === n", arg=len(skipped), timeout=30_000)
    lanes = page.evaluate("document.getElementById('gantt').layout.yaxis.categoryarray")
    assert {f"traj {t} · skipped" for t in skipped} <= set(lanes)
    trained = set(Span.objects.filter(run=run, step=SKIPPED_STEP, kind="learner.backward").values_list("traj", flat=True))
    assert {f"traj {t}" for t in trained} <= set(lanes)
    # the chart is as tall as its figure: no blank band below it
    heights = page.evaluate("[document.getElementById('gantt').offsetHeight, document.getElementById('gantt').layout.height]")
    assert abs(heights[0] - heights[1]) <= 2

    # hover a bar, then redraw under a still pointer: the tooltip goes
    verify = Span.objects.get(run=run, traj=skipped[0], kind="rollout.verify")
    page.mouse.move(*point_of(page, verify, lane=f"traj {skipped[0]} · skipped"))
    page.wait_for_selector(".gantt-tip:not([hidden])")
    page.select_option("#traj-step", "1")
    page.wait_for_function("document.getElementById('gantt').layout.yaxis.categoryarray.every((l) => !l.endsWith('skipped'))")
    assert page.is_hidden(".gantt-tip")

    # a trajectory not in the drawn step: said so, and the chart is not faded
    page.fill("#traj-search", str(skipped[0]))
    page.dispatch_event("#traj-search", "change")
    page.wait_for_function("document.getElementById('traj-note').dataset.state === 'absent'")
    assert "is not in the drawn steps" in page.inner_text("#traj-note")
    assert page.evaluate("window.__thundersync.dimmed()") is False
    assert errors == []


def test_a_trace_range_the_server_would_refuse_is_said_on_the_page(live_url, browser_page, alice, run):
    """Before the fix: 9-2 showed nothing (the 400 went into a cancelled download); past the last step
    gave an empty trace."""
    page, errors = browser_page
    open_finished(page, live_url, run)
    page.fill("#trace-from", "3")
    page.fill("#trace-to", "1")
    assert "first step 3 is after last step 1" in page.inner_text("#trace-error")
    assert page.get_attribute("#trace-link", "aria-disabled") == "true"
    page.fill("#trace-to", "")
    page.fill("#trace-from", "9")
    assert "the run has no step 9: its last step is 3" in page.inner_text("#trace-error")
    downloads = []
    page.on("download", lambda download: downloads.append(download))
    page.click("#trace-link", force=True)  # aria-disabled: Playwright would not click it otherwise
    page.wait_for_timeout(300)  # a click that starts no download: nothing to wait for
    assert downloads == []
    answer = page.request.get(f"{live_url}/api/runs/{run.pk}/trace.json?step_from=9")
    assert answer.status == 400 and "step_from" in answer.json()["errors"]
    page.fill("#trace-from", "2")
    assert page.is_hidden("#trace-error") and page.get_attribute("#trace-link", "aria-disabled") == "false"
    assert errors == []


def test_cancel_asks_first(live_url, browser_page, alice, alice_experiment, streaming_preset):
    """Before the fix: one click killed a 200-step run."""
    page, errors = browser_page
    running = make_run(alice_experiment, streaming_preset, steps=200, status=Run.Status.RUNNING, name="long run",
                       supervisor="worker-elsewhere:1:1", heartbeat=timezone.now())
    log_in(page, live_url, "alice", "alice-password")
    page.goto(f"{live_url}/runs/{running.pk}/")
    page.wait_for_function(f"{STATE}.replayDone")
    asked = []
    page.once("dialog", lambda dialog: (asked.append(dialog.message), dialog.dismiss()))
    page.click("#cancel-button")
    page.wait_for_timeout(300)
    assert asked and "Cancel long run?" in asked[0] and "0 of 200 steps" in asked[0]
    running.refresh_from_db()
    assert not running.cancel_requested
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#cancel-button")
    page.wait_for_selector(".messages")
    running.refresh_from_db()
    assert running.cancel_requested
    assert errors == []


def test_idle_tiles_agree_and_steps_count_from_zero(live_url, browser_page, alice, run):
    """Before the fix: the two idle tiles disagreed for the same final step; "step 1 / 20" vs step 0."""
    page, errors = browser_page
    open_finished(page, live_url, run)
    last = StepMetric.objects.get(run=run, step=3).values["trainer/idle_ratio"]
    page.wait_for_function("document.getElementById('idle-live').textContent !== '—'")
    assert page.inner_text("#idle-live") == page.inner_text("#idle-last") == f"{100 * last:.1f}%"
    assert page.inner_text("#idle-live-hint").startswith("step 3,") and "step done" in page.inner_text("#idle-live-hint")
    assert page.inner_text("#progress") == "finished: 4 / 4 steps (steps 0–3)"
    assert errors == []


@pytest.fixture
def run_dir(monkeypatch, tmp_path):
    """Where the daphne process (started after this fixture) reads run logs."""
    monkeypatch.setenv("THUNDERSYNC_RUN_DIR", str(tmp_path / "runs"))
    return tmp_path / "runs"


def test_the_log_panel_drops_progress_bar_redraws(run_dir, live_url, browser_page, alice, run):
    """Before the fix: tqdm's bar repeated around every line; a warning glued to the last bar."""
    page, errors = browser_page
    bar = "sync:  50%|█████     | 4/8 [00:05<00:05,  1.26s/it]"
    lines = ["boot: first generate", bar.replace("50%", "38%"), bar, " " * 51,
             "step   3  reward 0.180  step 1.05s  learner idle 34.8%", "", bar,
             "sync: 100%|██████████| 8/8 [00:09<00:00,  1.16s/it][2026-12-01 19:15:24,354] [WARNING] [real_accelerator.py:213] Setting accelerator to CPU.",
             "done: 8 steps in 10.5s"]
    log = run_dir / f"run-{run.pk}" / "learner.stderr.log"
    log.parent.mkdir(parents=True)
    log.write_text("\n".join(lines) + "\n")
    open_finished(page, live_url, run)
    page.wait_for_function("document.getElementById('log-tail').textContent.includes('done: 8 steps')")
    assert page.inner_text("#log-tail").splitlines() == [
        "boot: first generate", "step   3  reward 0.180  step 1.05s  learner idle 34.8%",
        "sync: 100%|██████████| 8/8 [00:09<00:00,  1.16s/it]",
        "[2026-12-01 19:15:24,354] [WARNING] [real_accelerator.py:213] Setting accelerator to CPU.",
        "done: 8 steps in 10.5s"]
    assert errors == []


def test_metric_panel_searches_overlays_smoothing_and_shows_ratios_in_percent(live_url, browser_page, alice, run):
    """Before the fix: smoothing replaced the raw line; a ctrl-click list, no search, cut names; idle 0-1."""
    page, errors = browser_page
    open_finished(page, live_url, run)
    page.fill("#metric-search", "idle")
    shown = page.evaluate("[...document.querySelectorAll('#metric-picker label')].filter((l) => !l.hidden).map((l) => l.dataset.metric)")
    assert shown and all("idle" in name for name in shown) and "trainer/idle_ratio" in shown
    pick_metrics(page, ["trainer/idle_ratio"])
    chart = "#metric-charts [data-metric='trainer/idle_ratio']"
    stored = [m.values["trainer/idle_ratio"] for m in StepMetric.objects.filter(run=run).order_by("step")]
    page.wait_for_function(f"document.querySelector(\"{chart}\")?.data?.[0]?.y?.length === 4")
    assert page.evaluate(f"document.querySelector(\"{chart}\").data[0].y") == pytest.approx([100 * v for v in stored])
    assert page.evaluate(f"document.querySelector(\"{chart}\").layout.yaxis.title.text") == "trainer/idle_ratio (%)"
    page.select_option("#metric-smoothing", "0.8")
    page.wait_for_function(f"document.querySelector(\"{chart}\").data.length === 2")
    raw, smooth = page.evaluate(f"document.querySelector(\"{chart}\").data.map((t) => ({{y: t.y, opacity: t.opacity, name: t.name}}))")
    assert raw["y"] == pytest.approx([100 * v for v in stored]) and raw["opacity"] == 0.3
    assert smooth["name"].endswith("EMA 0.8") and smooth["y"][-1] != raw["y"][-1]
    # every name whole: no label wider than the list
    assert page.evaluate("[...document.querySelectorAll('#metric-picker label')].every((l) => l.scrollWidth <= l.clientWidth + 1)")
    assert errors == []


def test_a_long_optimizer_span_is_explained(live_url, browser_page, alice, run):
    """Before the fix: a last-step optimizer bar 44x the median with no explanation."""
    page, errors = browser_page
    optimizer = Span.objects.get(run=run, step=3, kind="learner.optimizer")
    optimizer.t1 = optimizer.t0 + 0.153
    optimizer.save()
    metric = StepMetric.objects.get(run=run, step=3)
    metric.values["mismatch/tokens"] = 321
    metric.save()
    open_finished(page, live_url, run)
    page.mouse.move(*point_of(page, optimizer, t=optimizer.t0 + 0.02))  # before the publish it now overlaps
    page.wait_for_selector(".gantt-tip:not([hidden])")
    tip = page.inner_text(".gantt-tip")
    assert "learner.optimizer" in tip and "the step's barrier" in tip and "over 321 tokens (mismatch/tokens)" in tip
    assert "× the run's median optimizer span (50.0 ms)" in tip
    assert errors == []


def test_a_steps_trajectories_as_a_sortable_table(live_url, browser_page, alice, run):
    page, errors = browser_page
    open_finished(page, live_url, run)
    page.select_option("#lane-mode", "traj")
    page.select_option("#traj-step", str(SKIPPED_STEP))
    trajs = sorted(set(Span.objects.filter(run=run, step=SKIPPED_STEP, kind="rollout.verify").values_list("traj", flat=True)))
    page.wait_for_function("(n) => document.querySelectorAll('#traj-table tbody tr').length === n", arg=len(trajs))
    page.click("#traj-table th[data-key='tokens']")
    page.click("#traj-table th[data-key='tokens']")  # twice: most tokens first
    assert page.get_attribute("#traj-table", "data-sort") == "tokens:desc"
    rows = page.evaluate("[...document.querySelectorAll('#traj-table tbody tr')].map((tr) => Object.fromEntries("
                         "[...tr.children].map((td) => [td.dataset.key, td.textContent])))")
    tokens = {t: sum(Span.objects.filter(run=run, traj=t, kind="rollout.generate").values_list("tokens", flat=True))
              for t in trajs}
    assert [int(r["tokens"]) for r in rows] == sorted(tokens.values(), reverse=True)
    assert {int(r["traj"]): int(r["tokens"]) for r in rows} == tokens
    states = {int(r["traj"]): r["state"] for r in rows}
    assert {t for t, s in states.items() if s == "skipped"} == set(skipped_trajs(run))
    assert all(s == "trained" for t, s in states.items() if t not in skipped_trajs(run))
    assert errors == []
