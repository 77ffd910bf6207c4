"""A ``thundersync`` process ends even when an exit function hangs (learner/stopping.py,
``exit_within``): injected here as an exit function that waits forever, the way
multiprocessing's join of a wedged queue feeder thread once kept a learner alive."""

import subprocess
import sys
import time

from learner.rollout.processes import boot

HANGING_EXIT = """
import atexit, sys, threading
from learner import cli, stopping
stopping.EXIT_DEADLINE_S = 1.0
atexit.register(threading.Event().wait)  # an exit function that never returns
sys.argv = ["thundersync", *sys.argv[1:]]
sys.exit(cli.entry())
"""


def test_a_hanging_exit_function_cannot_keep_the_process_alive(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: {steps: -1}\n")
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", HANGING_EXIT, "train", "--config", str(bad)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2, r.stderr  # main's own code (an invalid config), not a crash
    assert "train.steps" in r.stderr and "exit still unfinished after 1s" in r.stderr
    assert time.monotonic() - t0 < 30


def test_the_console_script_goes_through_the_bounded_exit():
    from importlib.metadata import entry_points

    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "thundersync"]
    assert script.value == "learner.cli:entry"


def test_stopped_workers_queues_are_not_joined_at_exit():
    """Once its worker is gone, a command queue's unsent items are for nobody: stop_workers
    cancels the exit-time join of its feeder thread."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    proc = ctx.Process(target=int)  # exits at once, never reading its queue
    proc.start()
    boot.stop_workers([q], [proc], grace_s=10.0)
    assert not proc.is_alive() and q._joincancelled
