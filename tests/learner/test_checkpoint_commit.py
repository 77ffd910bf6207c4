"""Committed checkpoints (learner/checkpoint.py, docs/checkpoints.md): only a checkpoint
whose marker lists every file at its written size counts; ``--resume`` removes the rest and
continues from the newest committed one, bit for bit."""

import json
import os
import signal
import subprocess
import textwrap
from pathlib import Path

import pytest
import torch

from learner.checkpoint import (COMMITTED, RunState, discard, latest_checkpoint, list_checkpoints,
                                remove_uncommitted, save_checkpoint)

from .test_cli_faults import CLI, curve, final_weights, tagged_semaphores, wait_gone


def tiny_checkpoints(out: Path, steps: int) -> list[Path]:
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    return [save_checkpoint(out, model, optimizer, RunState(steps_done=s, version=s, seq=0, clock=0.0, next_traj=0,
                                                            next_group=0), keep=10) for s in range(1, steps + 1)]


def test_a_torn_or_unmarked_checkpoint_is_not_one_and_is_removed(tmp_path):
    first, second, third = tiny_checkpoints(tmp_path, 3)
    assert latest_checkpoint(tmp_path) == third and json.loads((third / COMMITTED).read_text())["files"]
    with open(third / "model.safetensors", "r+b") as f:  # torn: shorter than committed
        f.truncate(10)
    (second / COMMITTED).unlink()  # no marker, and a file gone: a kill while deleting it
    (second / "optimizer.pt").unlink()
    half = tmp_path / "checkpoints" / ".tmp-step-000003-4242"
    half.mkdir()
    assert list_checkpoints(tmp_path) == [first]
    assert remove_uncommitted(tmp_path) == [".tmp-step-000003-4242", second.name, third.name]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [first.name]


def test_a_whole_checkpoint_from_before_markers_still_counts_and_is_kept(tmp_path):
    first, second = tiny_checkpoints(tmp_path, 2)
    for path in (first, second):
        (path / COMMITTED).unlink()  # as written before commit markers existed
    assert list_checkpoints(tmp_path) == [first, second]
    assert remove_uncommitted(tmp_path) == [] and latest_checkpoint(tmp_path) == second
    (second / "state.json").write_text("{")  # unreadable state: not a checkpoint
    assert list_checkpoints(tmp_path) == [first]


def test_a_discarded_checkpoint_leaves_the_step_names_at_once(tmp_path):
    first, second = tiny_checkpoints(tmp_path, 2)
    discard(second)
    assert list_checkpoints(tmp_path) == [first] and not list((tmp_path / "checkpoints").glob(".tmp-*"))


# Fault injection: the learner's process group is SIGKILLed by the learner itself the first
# time Python opens a file of the checkpoint named in THUNDERSYNC_TEST_KILL_AT: the tensors
# are written by then (safetensors and torch.save open their files natively), the fsyncs and
# the commit marker not (a kill in the middle of a checkpoint, every time).
KILL_MID_CHECKPOINT = textwrap.dedent('''
    import builtins, os, signal
    _open, _at = builtins.open, os.environ.get("THUNDERSYNC_TEST_KILL_AT", "")

    def _open_or_die(file, *args, **kwargs):
        if _at and isinstance(file, (str, os.PathLike)) and _at in os.fspath(file):
            os.killpg(0, signal.SIGKILL)
        return _open(file, *args, **kwargs)

    builtins.open = _open_or_die
''')


def train(out: Path, *args, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(CLI + ["train", *args, "--quiet"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, env={**os.environ, **(env or {})})


@pytest.mark.slow
def test_a_run_killed_mid_checkpoint_resumes_from_the_last_committed_one_bit_for_bit(tmp_path):
    """sync, 4 steps, a checkpoint after each: run A uninterrupted beside run B, whose group is
    killed while writing the step-2 checkpoint; B resumed must drop the half-written one,
    continue from step 1's and end with A's weights and rewards exactly."""
    inject = tmp_path / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(KILL_MID_CHECKPOINT)
    a, b = tmp_path / "A", tmp_path / "B"
    common = ("--config", "configs/quickstart.yaml", "--schedule", "sync", "--steps", "4", "--checkpoint-every", "1")
    fault = {"PYTHONPATH": os.pathsep.join([str(inject), os.environ.get("PYTHONPATH", "")]),
             "THUNDERSYNC_TEST_KILL_AT": ".tmp-step-000002-"}
    procs = [train(a, *common, "--output", str(a)), train(b, *common, "--output", str(b), env=fault)]
    try:
        killed_stderr = procs[1].communicate(timeout=300)[1]
        assert procs[1].returncode == -signal.SIGKILL, killed_stderr
        wait_gone(procs[1].pid)
        half, = (b / "checkpoints").glob(".tmp-step-000002-*")
        assert (half / "model.safetensors").exists() and not (half / COMMITTED).exists()
        assert [p.name for p in list_checkpoints(b)] == ["step-000000", "step-000001"]
        procs.append(train(b, "--resume", str(b)))
        resumed_stderr = procs[2].communicate(timeout=300)[1]
        stderr_a = procs[0].communicate(timeout=300)[1]
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert procs[0].returncode == 0 and procs[2].returncode == 0, (stderr_a, resumed_stderr)
    assert f"removed {half}: a checkpoint never committed" in resumed_stderr
    assert not list((b / "checkpoints").glob(".tmp-*"))
    assert [p.name for p in list_checkpoints(b)] == ["step-000001", "step-000002", "step-000003"]
    assert curve(resumed_stderr) == curve(stderr_a)  # the same rewards, step by step
    wa, wb = final_weights(a), final_weights(b)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[n], wb[n]) for n in wa)
    assert tagged_semaphores(procs[1].pid) == []  # the killed run's janitor swept them
