"""fully-async as a first-class run, in a real browser against the real app: its rollout spans
arrive stamped step -1 and take their step from the learner's assignment events through the real
ingestor, so "Compare latest runs" picks it beside sync, its aligned timeline shows rollouts, its
"by trajectory" table lists every trajectory of a step (skipped ones too), a trace of its last
steps has rollout events, and the compare page warns that it trained shorter trajectories."""

import json
import random

import pytest
from tests.harness.web_harness import agent_run_events, browser_page, live_url, log_in  # noqa: F401 (fixtures)

from controller.ingest.ingestion import RunIngestor
from controller.models import Run, Schedule, Span, StepMetric

from .conftest import make_run
from .test_browser_insight import store_workload
from .test_browser_progress import STATE, in_thread

pytestmark = pytest.mark.browser
STEPS = 4


def fully_async_lines(seed: int) -> tuple[list[str], dict[int, set[int]], set[int]]:
    """The JSONL a fully-async run streams (lines), each step's trajectories and the skipped ones
    (advantage 0: no backward). Rollout spans carry step -1 and the version that sampled them;
    each step's assignment comes after its rollouts, before its learner spans."""
    spans, metrics = agent_run_events(STEPS, groups=3, group_size=4, workers=2, slots=3, max_turns=4, seed=seed,
                                      learn_after_rollout=True)
    rng = random.Random(seed)
    trained = {s: {e["traj"] for e in spans if e["step"] == s and e["traj"] is not None} for s in range(STEPS)}
    skipped = {min(trajs) for trajs in trained.values()}  # one zero-advantage trajectory a step
    lines, assigned = [], set()
    for e in spans:
        if e["kind"].startswith("learner.") and e["step"] not in assigned:
            lines.append(json.dumps({"type": "assignment", "step": e["step"], "trajs": sorted(trained[e["step"]])}))
            assigned.add(e["step"])
        if e["kind"] == "learner.backward" and e["traj"] in skipped:
            continue
        lines.append(json.dumps({**e, "step": -1} if e["kind"].startswith("rollout.") else e))
    for m in metrics:  # the groups that finish first: shorter trajectories than sync samples
        m["values"]["response_length/mean"] = 28.0 + rng.uniform(-1, 1)
        lines.append(json.dumps(m))
    return lines, trained, skipped


def ingest(run, lines) -> RunIngestor:
    ingestor = RunIngestor(run.pk, flush_s=60.0, flush_spans=40)  # flushes between a rollout and its assignment
    for line in lines:
        ingestor.feed(line)
        ingestor.flush_if_due()
    ingestor.flush()
    assert ingestor.rejected == []
    return ingestor


@pytest.fixture
def fully_async_preset(db):
    return Schedule.objects.create(owner=None, name="fully-async", kind="fully-async", knobs={"max_staleness": 2})


@pytest.fixture
def runs(alice_experiment, sync_preset, fully_async_preset):
    preset = fully_async_preset
    sync = make_run(alice_experiment, sync_preset, steps=STEPS, name="sync run")
    store_workload(sync, seed=1, boot_s=5.0, steps=STEPS)
    rng = random.Random(3)
    for m in StepMetric.objects.filter(run=sync):
        m.values["response_length/mean"] = 40.0 + rng.uniform(-1, 1)
        m.save()
    fully = make_run(alice_experiment, preset, steps=STEPS, name="fully-async run")
    lines, trained, skipped = fully_async_lines(seed=2)
    ingest(fully, lines)
    return sync, fully, trained, skipped


def test_compare_latest_takes_it_and_shows_its_rollouts_and_what_it_trained(live_url, browser_page, alice, runs):
    page, errors = browser_page
    sync, fully, trained, _ = runs
    assert not Span.objects.filter(run=fully, step=-1).exists()  # every rolled-out group was trained
    log_in(page, live_url, "alice", "alice-password")
    page.goto(f"{live_url}/experiments/{sync.experiment_id}/")
    assert page.get_attribute("#compare-link", "href") == f"/compare/?runs={sync.pk},{fully.pk}"
    page.click("#compare-link")
    page.wait_for_selector("#compare-app[data-ready='1']", timeout=60_000)
    assert page.is_hidden("#compare-warnings")  # the preset's max_staleness is its knob, not a config difference
    warning = page.inner_text("#trained-warnings")
    assert page.is_visible("#trained-warnings") and "fully-async" in warning and "shorter trajectories than sync" in warning
    last = STEPS - 1
    assert page.input_value("#compare-step") == str(last)
    # its step's Gantt: rollout lanes and kinds (before: every rollout span had step -1, the step none)
    chart = f"document.getElementById('timeline-{fully.pk}')"
    kinds = set(page.evaluate(f"{chart}.data.map((t) => t.name).filter(Boolean)"))
    lanes = page.evaluate(f"{chart}.layout.yaxis.categoryarray")
    assert {"rollout.generate", "rollout.verify", "learner.backward"} <= kinds
    rolled = {s.lane for s in Span.objects.filter(run=fully, step=last, kind="rollout.generate")}
    assert rolled and rolled <= set(lanes)
    assert errors == []


def test_by_trajectory_lists_skipped_ones_and_a_trace_of_its_last_steps_has_rollouts(live_url, browser_page, alice, runs):
    page, errors = browser_page
    _, fully, trained, skipped = runs
    last = STEPS - 1
    log_in(page, live_url, "alice", "alice-password")
    page.goto(f"{live_url}/runs/{fully.pk}/")
    page.select_option("#lane-mode", "traj")
    page.select_option("#traj-step", str(last))
    page.wait_for_function(f"document.querySelectorAll('#traj-table tbody tr').length === {len(trained[last])}",
                           timeout=30_000)
    shown = page.evaluate("[...document.querySelectorAll('#traj-table tbody tr')].map((tr) => Number(tr.dataset.traj))")
    assert sorted(shown) == sorted(trained[last]) and skipped & trained[last] <= set(shown)
    trace = page.request.get(f"{live_url}/api/runs/{fully.pk}/trace.json?step_from={last - 1}").json()
    rollouts = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e["name"] == "rollout.generate"]
    assert rollouts and {e["args"]["step"] for e in rollouts} == {last - 1, last}
    assert {e["args"]["traj"] for e in rollouts} == trained[last - 1] | trained[last]
    assert errors == []


def test_a_live_page_moves_rollouts_it_holds_with_step_minus_one_to_their_step(
        live_url, browser_page, alice, alice_experiment, fully_async_preset):
    """The spans a page received before their step took them follow the assignment frame."""
    page, errors = browser_page
    run = make_run(alice_experiment, fully_async_preset, steps=STEPS, name="live fully-async", status=Run.Status.RUNNING)
    lines, trained, skipped = fully_async_lines(seed=4)
    log_in(page, live_url, "alice", "alice-password")
    page.goto(f"{live_url}/runs/{run.pk}/")
    page.wait_for_function(f"{STATE}.replayDone && {STATE}.open", timeout=30_000)
    page.select_option("#lane-mode", "traj")
    in_thread(ingest, run, lines)
    last = STEPS - 1
    page.wait_for_function(f"document.querySelectorAll('#traj-step option').length === {STEPS}", timeout=30_000)
    page.select_option("#traj-step", str(last))
    # the skipped trajectory has no backward: only its rollouts, moved to the step, give it a row
    skip = (skipped & trained[last]).pop()
    page.wait_for_selector(f"#traj-table tbody tr[data-traj='{skip}']", timeout=30_000)
    shown = page.evaluate("[...document.querySelectorAll('#traj-table tbody tr')].map((tr) => Number(tr.dataset.traj))")
    assert sorted(shown) == sorted(trained[last])
    assert page.evaluate(f"{STATE}.spansReceived") == Span.objects.filter(run=run).count()
    assert errors == []
