"""JsonlSink: events are written in order, in the learner's waits, never later than MAX_DELAY_S."""

import json

from learner.timeline import JsonlSink, Span, StepMetrics


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def span(i):
    return Span(step=0, kind="rollout.generate", t0=i, t1=i + 0.5, lane="rollout/0/0", seq=i)


def test_spans_wait_for_the_learners_idle_moment_and_keep_their_order(tmp_path):
    path = tmp_path / "events.jsonl"
    sink = JsonlSink(str(path))
    for i in range(200):
        sink.emit(span(i))
    sink.emit(StepMetrics(0, {"timing_s/step": 1.0}))
    assert path.read_text() == ""  # nothing serialised on the learner's busy path
    sink.idle(lambda: False)
    events = lines(path)
    assert [e["seq"] for e in events[:-1]] == list(range(200)) and events[-1]["type"] == "metrics"


def test_idle_stops_writing_once_the_fleet_has_a_message(tmp_path):
    path = tmp_path / "events.jsonl"
    sink = JsonlSink(str(path))
    for i in range(3 * JsonlSink.CHUNK):
        sink.emit(span(i))
    sink.idle(lambda: True)  # a trajectory is waiting: one chunk, then back to learning
    assert len(lines(path)) == JsonlSink.CHUNK
    sink.close()  # the rest is written at the end, in order
    assert [e["seq"] for e in lines(path)] == list(range(3 * JsonlSink.CHUNK))


def test_run_status_is_written_at_once_and_nothing_waits_past_the_delay(tmp_path, monkeypatch):
    path = tmp_path / "events.jsonl"
    sink = JsonlSink(str(path))
    sink.emit(span(0))
    sink.emit({"type": "run", "status": "started"})
    assert [e["type"] for e in lines(path)] == ["span", "run"]
    clock = [100.0]
    monkeypatch.setattr("learner.timeline.time.monotonic", lambda: clock[0])
    sink.emit(span(1))
    assert len(lines(path)) == 2
    clock[0] += JsonlSink.MAX_DELAY_S + 0.01  # a learner that never waits still reports live
    sink.emit(span(2))
    assert [e.get("seq") for e in lines(path)] == [0, None, 1, 2]
