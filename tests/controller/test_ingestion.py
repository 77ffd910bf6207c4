"""The learner's JSONL stream -> rows and frames (RunIngestor, finish_run)."""

import json

import pytest

from controller.ingest import ingestion
from controller.ingest.ingestion import RunIngestor, finish_run
from controller.ingest.run_events import span_from_event
from controller.models import Checkpoint, Run, Span, StepMetric, SystemSample

from .conftest import make_run, store_metrics

pytestmark = pytest.mark.django_db


def span_line(seq, step=0, **fields):
    event = {"type": "span", "seq": seq, "step": step, "kind": "learner.backward", "t0": seq * 0.1,
             "t1": seq * 0.1 + 0.05, "lane": "learner/0", "traj": seq, "group": 0, "turn": None,
             "policy_version": 0, "tokens": 7, **fields}
    return json.dumps(event)


def metrics_line(step, **values):
    return json.dumps({"type": "metrics", "step": step, "values": values})


def ingestor(run, flush_spans=500):
    return RunIngestor(run.pk, flush_s=60.0, flush_spans=flush_spans)


def test_it_stores_spans_metrics_and_checkpoints(alice_run):
    ing = ingestor(alice_run)
    for line in [span_line(0), span_line(1, step=1), metrics_line(0, **{"timing_s/step": 1.5}),
                 json.dumps({"type": "checkpoint", "step": 1, "path": "/tmp/ckpt-1"})]:
        ing.feed(line)
    ing.flush()
    assert list(Span.objects.filter(run=alice_run).values_list("seq", "step", "tokens")) == [(0, 0, 7), (1, 1, 7)]
    assert StepMetric.objects.get(run=alice_run, step=0).values == {"timing_s/step": 1.5}
    assert Checkpoint.objects.get(run=alice_run).path == "/tmp/ckpt-1"


def test_ingesting_the_same_lines_twice_is_harmless(alice_run):
    lines = [span_line(i) for i in range(5)] + [metrics_line(0, a=1.0)]
    for _ in range(2):
        ing = ingestor(alice_run)
        for line in lines:
            ing.feed(line)
        ing.flush()
    assert Span.objects.filter(run=alice_run).count() == 5
    assert StepMetric.objects.filter(run=alice_run).count() == 1


def test_a_later_metrics_event_for_a_step_wins(alice_run):
    ing = ingestor(alice_run)
    ing.feed(metrics_line(0, a=1.0))
    ing.flush()
    ing.feed(metrics_line(0, a=2.0))
    ing.flush()
    assert StepMetric.objects.get(run=alice_run, step=0).values == {"a": 2.0}


def test_it_flushes_when_the_span_batch_is_full(alice_run):
    ing = ingestor(alice_run, flush_spans=3)
    for seq in range(3):
        ing.feed(span_line(seq))
        ing.flush_if_due()
    assert Span.objects.filter(run=alice_run).count() == 3


def test_it_waits_for_the_interval_before_a_small_flush(alice_run):
    ing = ingestor(alice_run, flush_spans=3)
    ing.feed(span_line(0))
    ing.flush_if_due()
    assert Span.objects.filter(run=alice_run).count() == 0


def test_a_drained_burst_is_flushed_without_waiting_for_the_interval(alice_run, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr("controller.ingest.ingestion.time.monotonic", lambda: clock[0])
    ing = ingestor(alice_run, flush_spans=100)
    for seq in range(3):  # one write of the learner: three lines, then nothing waiting
        ing.feed(span_line(seq))
        ing.flush_if_due(drained=False)
    assert Span.objects.filter(run=alice_run).count() == 0 and ing.wait_s() == ingestion.MIN_FLUSH_S
    ing.flush_if_due(drained=True)  # within MIN_FLUSH_S of the last flush: a trickle waits a little
    assert Span.objects.filter(run=alice_run).count() == 0
    clock[0] += 2 * ingestion.MIN_FLUSH_S
    ing.flush_if_due(drained=True)
    assert Span.objects.filter(run=alice_run).count() == 3 and ing.wait_s() == ing.flush_s


@pytest.mark.parametrize("line, reason", [
    ("not json at all", "Expecting value"),
    ("[1, 2]", "not a JSON object"),
    (json.dumps({"type": "telemetry"}), "unknown event type"),
    (span_line(2**40), "span.seq"),
    (span_line(0, t0="soon"), "span.t0"),
    (span_line(0, lane=""), "span.lane"),
    (span_line(0, traj=1.5), "span.traj"),
    (json.dumps({"type": "metrics", "step": "one", "values": {}}), "metrics"),
    (json.dumps({"type": "run", "status": "exploded"}), "run.status"),
    (json.dumps({"type": "system", "t": "now", "node": "a", "values": {}}), "system"),
    (json.dumps({"type": "system", "t": 1.0, "node": "n" * 201, "values": {}}), "system"),
    (json.dumps({"type": "system", "t": 1.0, "node": "a", "values": [1]}), "system"),
])
def test_it_skips_malformed_lines_and_remembers_why(alice_run, line, reason):
    ing = ingestor(alice_run)
    ing.feed(line)
    ing.feed(span_line(0))
    ing.flush()
    assert reason in ing.rejected[0]
    assert Span.objects.filter(run=alice_run).count() == 1  # the good line still counts


def test_non_finite_metric_values_are_stored_as_null(alice_run):
    ing = ingestor(alice_run)
    ing.feed('{"type": "metrics", "step": 0, "values": {"staleness/mean": NaN, "x": Infinity, "y": 1.0}}')
    ing.flush()
    assert StepMetric.objects.get(run=alice_run).values == {"staleness/mean": None, "x": None, "y": 1.0}


def test_run_events_drive_the_status(alice_experiment, streaming_preset):
    run = make_run(alice_experiment, streaming_preset, status=Run.Status.STARTING)
    ing = ingestor(run)
    ing.feed(json.dumps({"type": "run", "status": "started", "config": {}, "t": 0.0}))
    ing.flush()
    run.refresh_from_db()
    assert run.status == "running"
    ing.feed(json.dumps({"type": "run", "status": "failed", "error": "CUDA: out of luck"}))
    assert ing.failure == "CUDA: out of luck" and not ing.finished


def test_finish_run_summarises_metrics_and_never_rewrites_a_finished_run(alice_experiment, streaming_preset):
    run = make_run(alice_experiment, streaming_preset, status=Run.Status.RUNNING)
    store_metrics(run, steps=2)
    finished = finish_run(run.pk, Run.Status.SUCCEEDED, summary={"wall_s": 3.0})
    assert finished.summary == {"steps": 2, "mean/reward/mean": 0.125, "mean/timing_s/step": 1.5,
                                "mean/trainer/idle_ratio": 0.375, "wall_s": 3.0}
    assert finished.finished is not None
    again = finish_run(run.pk, Run.Status.FAILED, "late")
    assert again.status == "succeeded" and again.error == ""


def test_span_from_event_keeps_every_field():
    span = span_from_event(json.loads(span_line(3, turn=2)))
    assert (span["seq"], span["kind"], span["turn"], span["tokens"], span["t1"]) == (
        3, "learner.backward", 2, 7, pytest.approx(0.35))


@pytest.mark.parametrize("vendor", ["postgresql", "sqlite"])
def test_both_span_writes_store_every_field_and_skip_a_stored_seq(alice_run, vendor, monkeypatch):
    """The PostgreSQL array insert and the bulk_create elsewhere store the same rows; a seq stored
    already keeps its first row (a re-ingested line is harmless)."""
    from controller.ingest import bulk_writes

    if vendor == "sqlite":  # the test database is PostgreSQL: take the other branch on it
        monkeypatch.setattr(bulk_writes.connection, "vendor", "sqlite")
    rows = [span_from_event(json.loads(span_line(seq, step=seq // 2, turn=None if seq % 2 else 1, kind=f"k{seq}")))
            for seq in range(5)]
    bulk_writes.write_spans(alice_run.pk, rows[:3])
    bulk_writes.write_spans(alice_run.pk, [{**rows[1], "kind": "rewritten"}, *rows[3:]])
    stored = list(Span.objects.filter(run=alice_run).order_by("seq").values(*rows[0]))
    assert stored == rows


@pytest.mark.django_db(transaction=True)
def test_a_lost_connection_during_the_array_insert_is_djangos_operational_error(alice_run):
    """The raw cursor's psycopg errors come out as Django's, which the supervisor retries."""
    import psycopg
    from django.db import OperationalError, connection

    from controller.ingest import bulk_writes

    connection.ensure_connection()
    backend = connection.connection.info.backend_pid
    with psycopg.connect(f"host=127.0.0.1 user=postgres dbname={connection.settings_dict['NAME']}",
                         autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [backend])
    with pytest.raises(OperationalError):
        bulk_writes.write_spans(alice_run.pk, [span_from_event(json.loads(span_line(0)))])
    connection.close()


def test_system_samples_are_stored_and_sent_to_the_page_in_time_order(alice_run, monkeypatch):
    sent = []
    monkeypatch.setattr(ingestion.live, "publish", lambda run_id, frame: sent.append(frame))
    ing = ingestor(alice_run)
    for t, cpu in ((2.0, 50.0), (4.0, float("nan"))):
        ing.feed(json.dumps({"type": "system", "t": t, "node": "gpu-node-1",
                             "values": {"system/driver/cpu_percent": cpu, "system/driver/rss_mb": 400.0}}))
    assert ing.pending()
    ing.flush()
    stored = list(SystemSample.objects.filter(run=alice_run).values("t", "node", "values"))
    assert stored == [
        {"t": 2.0, "node": "gpu-node-1", "values": {"system/driver/cpu_percent": 50.0, "system/driver/rss_mb": 400.0}},
        {"t": 4.0, "node": "gpu-node-1", "values": {"system/driver/cpu_percent": None, "system/driver/rss_mb": 400.0}}]
    assert [f for f in sent if f["type"] == "system"] == [{"type": "system", "samples": stored}]
