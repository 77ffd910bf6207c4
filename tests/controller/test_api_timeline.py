"""Metrics and spans of a run as JSON, and the exports (Chrome trace, CSV)."""

import csv
import io
import json

import pytest

from .conftest import store_metrics, store_spans

pytestmark = pytest.mark.django_db


def url(run, path=""):
    return f"/api/runs/{run.pk}/{path}"


def test_it_returns_metrics_in_step_order(alice_client, alice_run):
    store_metrics(alice_run, steps=3)
    metrics = alice_client.get(url(alice_run, "metrics/")).json()["metrics"]
    assert [m["step"] for m in metrics] == [0, 1, 2]
    assert metrics[1]["values"]["timing_s/step"] == 2.0


def test_it_pages_spans_by_seq(alice_client, alice_run):
    store_spans(alice_run, 25)
    first = alice_client.get(url(alice_run, "spans/"), {"limit": 10}).json()
    assert [s["seq"] for s in first["spans"]] == list(range(10)) and first["last_seq"] == 9
    rest = alice_client.get(url(alice_run, "spans/"), {"after": first["last_seq"], "limit": 100}).json()
    assert [s["seq"] for s in rest["spans"]] == list(range(10, 25)) and rest["last_seq"] == 24
    empty = alice_client.get(url(alice_run, "spans/"), {"after": 24}).json()
    assert empty == {"spans": [], "last_seq": 24, "next": None}


def test_spans_carry_every_contract_field(alice_client, alice_run):
    store_spans(alice_run, 2)
    span = alice_client.get(url(alice_run, "spans/")).json()["spans"][1]
    assert span == {"seq": 1, "step": 1, "kind": "rollout.generate", "t0": 0.1, "t1": 0.15000000000000002,
                    "lane": "rollout/0/0", "traj": 1, "group": 0, "turn": 0, "policy_version": 0, "tokens": 3}


def test_it_filters_spans_by_step_range(alice_client, alice_run):
    store_spans(alice_run, 30, steps=3)
    spans = alice_client.get(url(alice_run, "spans/"), {"step_from": 1, "step_to": 1}).json()["spans"]
    assert {s["step"] for s in spans} == {1} and len(spans) == 10


@pytest.mark.parametrize("params, field", [
    ({"after": "x"}, "after"),
    ({"after": -5}, "after"),
    ({"limit": 0}, "limit"),
    ({"limit": 10**9}, "limit"),
    ({"step_from": 2, "step_to": 1}, "step_to"),
    ({"step_to": "1e3"}, "step_to"),
])
def test_it_rejects_bad_span_queries(alice_client, alice_run, params, field):
    response = alice_client.get(url(alice_run, "spans/"), params)
    assert response.status_code == 400
    assert field in response.json()["errors"]


def test_trace_export_is_chrome_trace_json(alice_client, alice_run):
    store_spans(alice_run, 20, steps=2)
    response = alice_client.get(url(alice_run, "trace.json"), {"step_from": 1})
    assert response.status_code == 200
    assert "attachment" in response["Content-Disposition"]
    events = json.loads(b"".join(response.streaming_content))["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    assert len(complete) == 10 and all(e["args"]["step"] == 1 for e in complete)
    assert {e["pid"] for e in complete} == {1, 2}  # learner lane and rollout fleet
    assert complete[0]["dur"] == pytest.approx(50_000.0)  # 0.05 s in microseconds
    assert {e["args"]["name"] for e in events if e["name"] == "thread_name"} == {"learner/0", "rollout/0/0"}


def test_metrics_csv_has_one_row_per_step(alice_client, alice_run):
    store_metrics(alice_run, steps=2)
    response = alice_client.get(url(alice_run, "metrics.csv"))
    assert response["Content-Type"] == "text/csv"
    rows = list(csv.reader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert rows[0] == ["step", "reward/mean", "timing_s/step", "trainer/idle_ratio"]
    assert rows[2] == ["1", "0.25", "2.0", "0.25"]
