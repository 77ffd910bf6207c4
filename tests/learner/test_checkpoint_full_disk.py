"""A checkpoint that cannot be written (a full disk, injected at its fsync): one line naming
it, nothing half written left, the committed checkpoints before it intact; the CLI's run
fails with that line, not a traceback (learner/checkpoint.py ``CheckpointWriteError``)."""

import errno
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml

from learner.checkpoint import CheckpointWriteError, RunState, list_checkpoints, save_checkpoint
from learner.checkpoint_integrity import damage

from .test_checkpoint_commit import tiny_checkpoints

CLI = [sys.executable, "-m", "learner.cli"]


def test_a_full_disk_while_writing_a_checkpoint_is_one_line_and_leaves_the_others(tmp_path, monkeypatch):
    first, = tiny_checkpoints(tmp_path, 1)
    real_fsync = os.fsync

    def full(fd):
        if ".tmp-step-" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", full)
    model = torch.nn.Linear(3, 2)
    state = RunState(steps_done=2, version=2, seq=0, clock=0.0, next_traj=0, next_group=0)
    with pytest.raises(CheckpointWriteError) as caught:
        save_checkpoint(tmp_path, model, torch.optim.AdamW(model.parameters()), state, keep=3)
    assert str(caught.value) == f"cannot write the checkpoint {tmp_path}/checkpoints/step-000001: No space left on device"
    assert list_checkpoints(tmp_path) == [first] and damage(first) is None
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))


# Fault injection in the learner's process: fsync of a file of the step-1 checkpoint fails
# with ENOSPC, as on a full disk.
FULL_AT_STEP_1 = textwrap.dedent('''
    import errno, os
    _fsync = os.fsync

    def _full(fd):
        if ".tmp-step-000001-" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return _fsync(fd)

    os.fsync = _full
''')


@pytest.mark.slow
def test_a_run_whose_disk_fills_at_a_checkpoint_fails_in_one_line(tmp_path):
    inject = tmp_path / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(FULL_AT_STEP_1)
    small = yaml.safe_load(Path("configs/quickstart.yaml").read_text())
    small["task"]["tool_latency"] = {"distribution": "none"}
    small["rollout"]["max_new_tokens"] = 12
    small["train"].update(prompts_per_step=2, group_size=2, schedule="sync")
    (tmp_path / "small.yaml").write_text(yaml.safe_dump(small))
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(inject), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(CLI + ["train", "--quiet", "--config", str(tmp_path / "small.yaml"), "--steps", "2",
                                   "--checkpoint-every", "1", "--output", str(out)],
                            stderr=subprocess.PIPE, text=True, start_new_session=True, env=env)
    try:
        stderr = proc.communicate(timeout=300)[1]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 1 and "Traceback" not in stderr, stderr
    assert stderr.strip().splitlines()[-1] == (
        f"thundersync: run failed: cannot write the checkpoint {out}/checkpoints/step-000001: No space left on device")
    assert [p.name for p in list_checkpoints(out)] == ["step-000000"]
