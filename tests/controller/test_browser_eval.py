"""Eval metrics (train.eval_every) on the run page and the compare page, in a real browser
(Debian's chromium) against the real app, from the metrics a real learner run reported."""

import json
import subprocess
import sys

import pytest
import yaml
from tests.harness.web_harness import browser_page, live_url, log_in, pick_metrics  # noqa: F401 (fixtures)

from controller.ingest.run_events import finite_or_none
from controller.models import StepMetric

from .conftest import ROOT, make_run

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture(scope="module")
def learner_metrics(tmp_path_factory) -> list[dict]:
    """4 steps of configs/jsonl-math.yaml with a greedy eval after the second and the fourth."""
    tmp = tmp_path_factory.mktemp("eval-run")
    cfg = yaml.safe_load((ROOT / "configs" / "jsonl-math.yaml").read_text())
    cfg["train"].update(steps=4, eval_every=2, eval_prompts=6)
    cfg["task"]["tool_latency"] = {"distribution": "none"}
    (tmp / "c.yaml").write_text(yaml.safe_dump(cfg))
    r = subprocess.run([sys.executable, "-m", "learner.cli", "train", "--config", str(tmp / "c.yaml"), "--events",
                        str(tmp / "events.jsonl"), "--quiet"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    events = [json.loads(line) for line in (tmp / "events.jsonl").read_text().splitlines()]
    return [e for e in events if e["type"] == "metrics"]


def stored_run(experiment, preset, metrics, name):
    run = make_run(experiment, preset, steps=len(metrics), name=name)
    for m in metrics:
        StepMetric.objects.create(run=run, step=m["step"], values=finite_or_none(m["values"]))  # as ingestion stores them
    return run


def test_eval_metrics_show_on_the_run_and_compare_pages(live_url, browser_page, alice_experiment, streaming_preset,
                                                        sync_preset, learner_metrics):
    page, errors = browser_page
    assert "eval/reward" in learner_metrics[1]["values"] and "eval/reward" not in learner_metrics[0]["values"]
    run = stored_run(alice_experiment, streaming_preset, learner_metrics, "eval run")
    other = stored_run(alice_experiment, sync_preset, learner_metrics, "eval run 2")
    log_in(page, live_url, "alice", "alice-password")
    page.goto(f"{live_url}/runs/{run.pk}/")
    page.wait_for_function("[...document.querySelectorAll('#metric-picker input')].some((o) => o.value === 'eval/reward')",
                           timeout=60_000)
    names = page.evaluate("[...document.querySelectorAll('#metric-picker input')].map((o) => o.value)")
    assert {"eval/reward", "eval/pass@1", "eval/prompts", "eval/seconds"} <= set(names)
    pick_metrics(page, ["eval/reward", "eval/pass@1"])
    chart = "#metric-charts [data-metric='eval/reward']"
    page.wait_for_function(f"document.querySelector(\"{chart}\")?.data?.[0]?.y?.length === 2")
    trace = page.evaluate(f"document.querySelector(\"{chart}\").data[0]")
    evals = [m for m in learner_metrics if "eval/reward" in m["values"]]
    assert trace["x"] == [m["step"] for m in evals] == [1, 3]  # eval_every 2: steps 1 and 3 (0-based)
    assert trace["y"] == pytest.approx([m["values"]["eval/reward"] for m in evals])

    page.goto(f"{live_url}/compare/?runs={run.pk},{other.pk}")
    page.wait_for_selector("#compare-app[data-ready='1']", timeout=60_000)
    pick_metrics(page, ["eval/pass@1"])
    compare_chart = "#metric-charts [data-metric='eval/pass@1']"
    page.wait_for_function(f"document.querySelector(\"{compare_chart}\")?.data?.length === 2")
    lines = page.evaluate(f"document.querySelector(\"{compare_chart}\").data.map((d) => d.y)")
    assert lines == [[pytest.approx(m["values"]["eval/pass@1"]) for m in evals]] * 2
    assert errors == []
