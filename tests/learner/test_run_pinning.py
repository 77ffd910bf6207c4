"""Every thread of a run's processes on its planned core, in both launch paths: a run started as
a new ``thundersync`` process (the CLI, a cold start) and one forked by the warm runner (the app's
default, learner/warm/server.py). Threads started before a process pins itself (the events
flusher, a worker's outbox feeder) used to keep the whole machine (docs/processes.md)."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from learner.rollout.processes.cores import core_plan
from learner.warm.client import WarmProcess

ROOT = Path(__file__).resolve().parents[2]
ARGS = ["train", "--config", str(ROOT / "configs" / "quickstart.yaml"), "--steps", "2", "--events", "-", "--quiet"]


def thread_cores(pid: int) -> dict[str, str]:
    """Thread id -> its Cpus_allowed_list, for every thread of ``pid``."""
    found = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            status = (task / "status").read_text()
        except OSError:
            continue  # the thread ended meanwhile
        found[task.name] = next(line.split(":\t")[1].strip() for line in status.splitlines()
                                if line.startswith("Cpus_allowed_list"))
    return found


def process_group(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[2])


def rollout_workers(driver: int) -> list[int]:
    """The driver's children in its process group (its semaphore janitor has a session of its
    own, learner/stopping.py) but its multiprocessing resource tracker."""
    children = [int(c) for c in Path(f"/proc/{driver}/task/{driver}/children").read_text().split()]
    return [c for c in children if process_group(c) == process_group(driver)
            and b"resource_tracker" not in Path(f"/proc/{c}/cmdline").read_bytes()]


def layout_at_first_span(proc, timeout: float = 240.0) -> dict:
    """Once the run reports its first span (the driver has pinned itself, its worker samples):
    each process's set of thread masks and its thread count."""
    deadline = time.monotonic() + timeout
    for line in proc.stdout:
        if json.loads(line).get("type") == "span":
            break
        assert time.monotonic() < deadline, "no span within the timeout"
    layout = {"driver": thread_cores(proc.pid)}
    for n, pid in enumerate(rollout_workers(proc.pid)):
        layout[f"worker {n}"] = thread_cores(pid)
    for _ in proc.stdout:  # let it finish: the pipe must not fill
        pass
    assert proc.wait(120) == 0
    return {name: (sorted(set(masks.values())), len(masks)) for name, masks in layout.items()}


@pytest.fixture
def warm_runner(tmp_path):
    sock = tmp_path / "warm.sock"
    runner = subprocess.Popen([sys.executable, "-m", "learner.warm.server", "--socket", str(sock)], cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while not sock.exists():
            assert runner.poll() is None and time.monotonic() < deadline, "the warm runner did not get ready"
            time.sleep(0.1)
        yield sock
    finally:
        runner.terminate()
        runner.wait(30)


@pytest.mark.slow
def test_every_thread_of_a_run_is_on_its_core_cold_and_forked_alike(warm_runner, tmp_path):
    learner_core, worker_cores = core_plan(1, pin=True)
    if learner_core is None:
        pytest.skip("one core: nothing is pinned")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cold = subprocess.Popen([sys.executable, "-m", "learner.cli", *ARGS], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    cold_layout = layout_at_first_span(cold)
    forked = WarmProcess(warm_runner, ARGS, tmp_path, env)
    forked_layout = layout_at_first_span(forked)

    expected = {"driver": [str(learner_core)], "worker 0": [str(worker_cores[0])]}
    for layout in (cold_layout, forked_layout):
        assert {name: masks for name, (masks, _) in layout.items()} == expected, layout
        assert layout["driver"][1] >= 2  # the events flusher is there, started before the pin
