"""Rollout workers spawned before the driver imports torch (learner.rollout.processes.boot)."""

import subprocess
import sys

import pytest

from learner.config import RunConfig
from learner.rollout.processes.boot import boot_workers
from learner.rollout.processes.cores import core_plan
from learner.rollout.processes.fleet import Fleet, RolloutError
from learner.rollout.processes.messages import Failed, Init
from learner.rollout.processes.weights import WeightStore


def test_boot_module_needs_no_torch():
    # the point of the module: the driver can spawn workers before its own heavy imports
    code = "import sys, learner.rollout.processes.boot; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_core_plan_puts_the_learner_alone():
    learner, workers = core_plan(3, pin=True)
    if learner is None:
        pytest.skip("one core: nothing is pinned")
    assert learner not in workers and len(workers) == 3
    assert core_plan(2, pin=False) == (None, [None, None])


def test_unused_boot_stops_its_workers():
    booted = boot_workers([None, None])
    booted.close()  # the driver failed before it built a fleet (the workers may still be importing)
    assert all(not p.is_alive() for p in booted.procs)
    booted.close()  # idempotent


def test_a_malformed_init_is_reported_and_the_worker_exits_cleanly():
    booted = boot_workers([None])
    # the worker reads its init only after its imports; a malformed one is an error, not a hang
    booted.cmd_qs[0].put(Init("{}", "", None, {}, 0.0))
    assert booted.conns[0].poll(120)
    assert isinstance(booted.conns[0].recv(), Failed)
    # it leaves on its own (interpreter teardown after torch's imports can take seconds on a
    # loaded machine, longer than close()'s grace, so wait for it rather than close first)
    booted.procs[0].join(timeout=60)
    assert booted.procs[0].exitcode == 0
    booted.close()


def test_a_worker_init_error_names_the_worker():
    import torch

    booted = boot_workers([None])
    store = WeightStore({"w": torch.zeros(2)}, counters=booted.counters)
    cfg = RunConfig.model_validate({"model": {"policy": "builtin:tiny"}})
    with pytest.raises(RolloutError, match=r"rollout worker 0: .*no-such-model-dir"):
        Fleet(cfg, "/nonexistent/no-such-model-dir", None, store, 0.0, booted)
    booted.procs[0].join(timeout=30)
    assert booted.taken and not booted.procs[0].is_alive()
