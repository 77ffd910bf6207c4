"""JsonlSink: events are written in order, in the learner's waits or by the flusher thread once late."""

import json
import threading
import time

from learner.timeline import JsonlSink, Span, StepMetrics


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def span(i):
    return Span(step=0, kind="rollout.generate", t0=i, t1=i + 0.5, lane="rollout/0/0", seq=i)


def test_spans_wait_for_the_learners_idle_moment_and_keep_their_order(tmp_path):
    path = tmp_path / "events.jsonl"
    sink = JsonlSink(str(path), max_delay_s=None)  # no flusher: only the idle path writes
    for i in range(200):
        sink.emit(span(i))
    sink.emit(StepMetrics(0, {"timing_s/step": 1.0}))
    assert path.read_text() == ""  # nothing serialised on the learner's busy path
    sink.idle(lambda: False)
    events = lines(path)
    assert [e["seq"] for e in events[:-1]] == list(range(200)) and events[-1]["type"] == "metrics"


def test_idle_stops_writing_once_the_fleet_has_a_message(tmp_path):
    path = tmp_path / "events.jsonl"
    sink = JsonlSink(str(path), max_delay_s=None)
    for i in range(3 * JsonlSink.CHUNK):
        sink.emit(span(i))
    sink.idle(lambda: True)  # a trajectory is waiting: one chunk, then back to learning
    assert len(lines(path)) == JsonlSink.CHUNK
    sink.close()  # the rest is written at the end, in order
    assert [e["seq"] for e in lines(path)] == list(range(3 * JsonlSink.CHUNK))


def test_run_status_is_written_at_once(tmp_path):
    path = tmp_path / "events.jsonl"
    sink = JsonlSink(str(path), max_delay_s=None)
    sink.emit(span(0))
    sink.emit({"type": "run", "status": "started"})
    assert [e["type"] for e in lines(path)] == ["span", "run"]


class ThreadRecordingFile:
    """A file whose writes remember which thread made them."""

    def __init__(self, fh):
        self.fh, self.writers = fh, []

    def write(self, text):
        self.writers.append(threading.get_ident())
        return self.fh.write(text)

    def flush(self):
        self.fh.flush()

    def close(self):
        self.fh.close()


def test_a_learner_that_never_waits_still_reports_within_the_delay_without_writing_itself(tmp_path):
    path = tmp_path / "events.jsonl"
    sink = JsonlSink(str(path), max_delay_s=0.05)
    sink._fh = recorder = ThreadRecordingFile(sink._fh)
    for i in range(500):  # the learner is busy: it emits and never calls idle
        sink.emit(span(i))
    deadline = time.monotonic() + 30  # the flusher wakes every 25 ms; the machine may be loaded
    while len(path.read_text().splitlines()) < 500 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [e["seq"] for e in lines(path)] == list(range(500))
    assert recorder.writers and threading.get_ident() not in recorder.writers
    sink.emit(span(500))
    sink.close()  # stops the flusher and writes what is left, in order
    assert [e["seq"] for e in lines(path)] == list(range(501))


def test_with_stdout_claimed_only_events_reach_stdout(tmp_path):
    """A library that prints, C code and a child process all write to fd 1: after claim_stdout
    that is stderr, and the event stream stays parseable."""
    import subprocess
    import sys

    script = (
        "import os, subprocess, sys\n"
        "from learner.timeline import JsonlSink, claim_stdout\n"
        "claim_stdout()\n"
        "print('[2026-01-01 00:00:00] [WARNING] a library talks')\n"
        "os.write(1, b'C code talks\\n')\n"
        "subprocess.run([sys.executable, '-c', 'print(\"a child talks\")'])\n"
        "sink = JsonlSink('-')\n"
        "sink.emit({'type': 'run', 'status': 'started'})\n"
        "sink.close()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert [json.loads(line) for line in done.stdout.splitlines()] == [{"type": "run", "status": "started"}]
    assert ["a library talks" in done.stderr, "C code talks" in done.stderr, "a child talks" in done.stderr] == [True] * 3
