"""A checkpoint that cannot be written (a full disk, injected at its fsync): one line naming
it, nothing half written left, the committed checkpoints before it intact
(learner/checkpoint.py ``CheckpointWriteError``)."""

import errno
import os
import textwrap

import pytest
import torch

from learner.checkpoint import CheckpointWriteError, RunState, list_checkpoints, save_checkpoint
from learner.checkpoint_integrity import damage

from .test_checkpoint_commit import tiny_checkpoints


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


# Fault injection in the learner's process: fsync of a file of the checkpoint whose temporary
# directory's name starts with THUNDERSYNC_TEST_FULL_AT fails with ENOSPC, as on a full disk
# (test_checkpoint_integrity.py runs it in a real run).
FULL_DISK_AT = textwrap.dedent('''
    import errno, os
    _fsync, _at = os.fsync, os.environ.get("THUNDERSYNC_TEST_FULL_AT", "")

    def _full(fd):
        if _at and _at in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return _fsync(fd)

    os.fsync = _full
''')
