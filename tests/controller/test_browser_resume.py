"""Resume from the browser: a real run killed mid-way shows its reason and a Resume button;
clicking it finishes the run as a new attempt whose steps continue the first attempt's on
the Gantt and the charts (docs/controller.md, "Checkpoints and resume"). Debian's chromium,
a daphne process, a real Celery worker and learner."""

import os
import signal
import time

import pytest
from tests.harness.web_harness import browser_page, live_url, log_in  # noqa: F401 (fixtures)
from controller.supervision.launching import launch_run
from controller.models import Checkpoint, Experiment, Run, Span, StepMetric

from .conftest import QUICKSTART, wait_for_status

pytestmark = [pytest.mark.browser, pytest.mark.slow]

STATE = "window.__thundersync.state()"
RUN_TIMEOUT_S = 600
STEPS = 3


def test_resume_button_finishes_a_killed_run_with_continuous_steps(
    live_url, browser_page, celery_worker, alice, sync_preset
):
    page, errors = browser_page
    config = {**QUICKSTART, "train": {**QUICKSTART["train"], "checkpoint_every": 1}}
    experiment = Experiment.objects.create(owner=alice, name="resumable", config=config)
    run_id = launch_run(experiment, sync_preset, steps=STEPS).pk
    log_in(page, live_url, "alice", "alice-password")
    page.goto(f"{live_url}/runs/{run_id}/")
    assert page.is_hidden("#resume-form")

    # the learner is killed once the first step is checkpointed
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not Checkpoint.objects.filter(run_id=run_id).exists():
        assert Run.objects.get(pk=run_id).status not in Run.FINISHED and time.monotonic() < deadline, "no checkpoint"
        time.sleep(0.1)
    os.kill(Run.objects.get(pk=run_id).pids[0], signal.SIGKILL)
    run = wait_for_status(run_id, Run.FINISHED, 60)
    assert run.status == Run.Status.FAILED and "killed by SIGKILL" in run.error
    page.wait_for_function(f"{STATE}.status === 'failed'", timeout=60_000)
    assert "killed by SIGKILL" in page.inner_text("#error-box")
    page.wait_for_selector("#resume-button", state="visible", timeout=30_000)  # the status frame shows it
    first_attempt = Span.objects.filter(run_id=run_id).count()
    done_before = StepMetric.objects.filter(run_id=run_id).count()
    assert 1 <= done_before < STEPS

    page.click("#resume-button")
    page.wait_for_url(f"{live_url}/runs/{run_id}/")
    assert "Resuming" in page.inner_text(".messages")
    run = wait_for_status(run_id, (Run.Status.SUCCEEDED, Run.Status.FAILED, Run.Status.CANCELLED), RUN_TIMEOUT_S)
    assert run.status == Run.Status.SUCCEEDED and run.attempt == 1, run.error
    page.wait_for_function(f"{STATE}.status === 'succeeded' && {STATE}.stepsDone === {STEPS}", timeout=60_000)
    # one number per step, continuing the first attempt's: on the charts (metrics) and the Gantt (spans)
    assert page.evaluate("window.__thundersync.metricSteps()") == list(range(STEPS))
    assert page.evaluate("window.__thundersync.spanSteps()") == list(range(STEPS))
    seqs = page.evaluate("window.__thundersync.seqs()")
    assert seqs == list(range(len(seqs))) and len(seqs) > first_attempt  # the second attempt's spans follow
    spans = list(Span.objects.filter(run_id=run_id).order_by("seq").values("seq", "t0"))
    later = min(s["t0"] for s in spans[first_attempt:])
    assert later >= max(s["t0"] for s in spans[:first_attempt]) - 1.0  # its clock continues too
    assert "attempt 2" in page.inner_text("#checkpoints")
    assert page.inner_text("#progress").startswith(f"finished: {STEPS} / {STEPS} steps")
    assert page.is_hidden("#resume-form")
    assert errors == []
