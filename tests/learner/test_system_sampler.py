"""The run's processes sampled on the wall clock (learner/driver/system_metrics.py, SystemSampler)."""

import os
import threading
import time

from learner.driver.system_metrics import SAMPLE_FLOOR_S, SystemSampler, sample_interval


def test_it_emits_a_system_event_per_interval_with_each_processs_cpu_and_memory_and_stops():
    events, got_two = [], threading.Event()

    def emit(event):
        events.append(event)
        if len(events) >= 2:
            got_two.set()

    clock = iter(range(1000))
    sampler = SystemSampler(0.1, lambda: float(next(clock)), lambda: {"driver": os.getpid()}, emit,
                            extra=lambda: {"system/driver/gpu_util": 7.0}).start()
    assert got_two.wait(30), "two samples within 30 s at a 0.1 s interval"
    sampler.stop()
    count = len(events)
    time.sleep(0.3)  # three intervals after the stop: nothing more is emitted
    assert len(events) == count == sampler.samples
    first = events[0]
    assert first["type"] == "system" and first["node"] == sampler.node and first["t"] < events[1]["t"]
    assert set(first["values"]) == {"system/driver/cpu_percent", "system/driver/rss_mb", "system/driver/gpu_util"}
    assert first["values"]["system/driver/rss_mb"] > 10 and first["values"]["system/driver/cpu_percent"] >= 0


def test_the_node_is_the_workers_name_for_it(monkeypatch):
    monkeypatch.setenv("THUNDERSYNC_NODE", "gpu-node-3")
    sampler = SystemSampler(1.0, lambda: 0.0, lambda: {}, lambda event: None)
    assert sampler.node == "gpu-node-3"


def test_a_process_gone_between_samples_is_left_out_not_a_failure():
    events, done = [], threading.Event()
    pids = {"driver": os.getpid(), "rollout_0": 2**22 + 12345}  # no such process

    def emit(event):
        events.append(event)
        done.set()

    sampler = SystemSampler(0.1, lambda: 1.0, lambda: pids, emit).start()
    assert done.wait(30)
    sampler.stop()
    assert all(not k.startswith("system/rollout_0/") for k in events[0]["values"])


def test_the_interval_starts_at_the_floor_and_grows_to_every_s_so_any_run_gets_ten_points():
    assert sample_interval(0.0, 2.0) == SAMPLE_FLOOR_S == 0.2
    assert sample_interval(10.0, 2.0) == 0.5 and sample_interval(1000.0, 2.0) == 2.0
    for run_s in (4.0, 5.0, 10.0, 30.0, 120.0, 3600.0):  # the samples a run of run_s seconds gets
        t, samples = 0.0, 0
        while (t := t + sample_interval(t, 2.0)) <= run_s:
            samples += 1
        assert samples >= 10, (run_s, samples)


def test_a_short_run_is_sampled_at_the_floor_not_every_two_seconds():
    events = []
    clock = iter(range(1000))
    sampler = SystemSampler(2.0, lambda: float(next(clock)), lambda: {"driver": os.getpid()}, events.append).start()
    deadline = time.monotonic() + 30
    while len(events) < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    sampler.stop()
    took = time.monotonic() - (deadline - 30)
    assert len(events) >= 5, f"{len(events)} samples in {took:.1f} s with every_s 2"
    assert took < 8.0  # five samples at 2 s would take 10 s
