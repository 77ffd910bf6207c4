"""The run's processes sampled on the wall clock (learner/driver/system_metrics.py, SystemSampler)."""

import os
import threading
import time

from learner.driver.system_metrics import SystemSampler


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
