"""Checkpoints verified by content (learner/checkpoint_integrity.py, docs/checkpoints.md):
each tampering of the newest checkpoint is caught, reported in one line naming it, set
aside, and the run resumes from the newest intact one; older checkpoints without digests
still load."""

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from learner.checkpoint import COMMITTED, RunState, list_checkpoints, load_checkpoint, save_checkpoint
from learner.checkpoint_integrity import damage, newest_intact

from .test_checkpoint_commit import tiny_checkpoints
from .test_checkpoint_full_disk import FULL_DISK_AT

CLI = [sys.executable, "-m", "learner.cli"]


def overwrite_same_size(path: Path, offset: int = 64, length: int = 256) -> None:
    """Flip ``length`` bytes at ``offset`` (within the file): its size does not change."""
    size = path.stat().st_size
    offset = min(offset, max(size - length, 0))
    with open(path, "r+b") as fh:
        fh.seek(offset)
        old = fh.read(min(length, size - offset))
        fh.seek(offset)
        fh.write(bytes(b ^ 0xFF for b in old))
    assert path.stat().st_size == size


def invalid_state_same_size(path: Path) -> None:
    size = (path / "state.json").stat().st_size
    (path / "state.json").write_text(("{" + "x" * size)[:size])
    assert (path / "state.json").stat().st_size == size


def resume_lines(out: Path) -> tuple[Path | None, list[str]]:
    lines: list[str] = []
    return newest_intact(out, lines.append), lines


def test_a_new_checkpoint_records_a_sha256_of_every_file(tmp_path):
    path, = tiny_checkpoints(tmp_path, 1)
    marker = json.loads((path / COMMITTED).read_text())
    assert set(marker["sha256"]) == set(marker["files"]) == {"model.safetensors", "optimizer.pt", "state.json"}
    assert all(len(d) == 64 for d in marker["sha256"].values()) and damage(path) is None


@pytest.mark.parametrize("name", ["model.safetensors", "optimizer.pt"])
def test_bytes_overwritten_at_the_same_size_skip_to_the_previous_checkpoint(tmp_path, name):
    first, second, third = tiny_checkpoints(tmp_path, 3)
    overwrite_same_size(third / name)
    found, lines = resume_lines(tmp_path)
    assert found == second and len(lines) == 1
    assert str(third) in lines[0] and f"{name} does not match its sha256" in lines[0]
    assert list_checkpoints(tmp_path) == [first, second]  # set aside: never pruned into, never resumed
    assert (tmp_path / "checkpoints" / "damaged" / third.name / name).is_file()


def test_an_invalid_state_of_the_same_size_skips_to_the_previous_checkpoint(tmp_path):
    first, second = tiny_checkpoints(tmp_path, 2)
    invalid_state_same_size(second)
    found, lines = resume_lines(tmp_path)
    assert found == first and len(lines) == 1 and "state.json does not match its sha256" in lines[0]
    load_checkpoint(found)  # what the run then loads


def test_every_damaged_newer_checkpoint_is_skipped_and_pruning_after_it_keeps_the_intact_one(tmp_path):
    first, second, third = tiny_checkpoints(tmp_path, 3)
    overwrite_same_size(third / "model.safetensors")
    invalid_state_same_size(second)
    found, lines = resume_lines(tmp_path)
    assert found == first and [str(third) in lines[0], str(second) in lines[1]] == [True, True]
    model = torch.nn.Linear(3, 2)  # the resumed run's next checkpoint, keep_checkpoints 1
    state = RunState(steps_done=2, version=2, seq=0, clock=0.0, next_traj=0, next_group=0)
    written = save_checkpoint(tmp_path, model, torch.optim.AdamW(model.parameters()), state, keep=1)
    assert list_checkpoints(tmp_path) == [written]


def test_checkpoints_written_before_digests_still_load_and_a_broken_one_is_skipped(tmp_path):
    first, second, third = tiny_checkpoints(tmp_path, 3)
    for path in (first, second):  # a marker of sizes only, as written before the digests
        marker = json.loads((path / COMMITTED).read_text())
        (path / COMMITTED).write_text(json.dumps({"files": marker["files"]}))
    (third / COMMITTED).unlink()  # and one from before markers existed
    assert damage(first) is None and damage(third) is None
    with open(third / "model.safetensors", "r+b") as fh:  # its header: same size, not safetensors
        fh.write(b"\xff" * 8)
    invalid_state_same_size(second)
    found, lines = resume_lines(tmp_path)
    assert found == first and "cannot be loaded" in lines[0] and "state.json: not JSON" in lines[1]


def test_resume_with_no_intact_checkpoint_is_one_line_and_exit_2(tmp_path):
    path, = tiny_checkpoints(tmp_path, 1)
    shutil.copy("configs/quickstart.yaml", tmp_path / "run.yaml")
    overwrite_same_size(path / "model.safetensors")
    r = subprocess.run(CLI + ["train", "--resume", str(tmp_path)], capture_output=True, text=True, timeout=120)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 2, r.stderr
    assert f"skipped the damaged checkpoint {path}" in lines[0]
    assert lines[1].startswith("thundersync: invalid config: --resume: no intact checkpoint under")


@pytest.mark.slow
def test_a_run_stopped_by_a_full_disk_whose_newest_checkpoint_is_then_damaged_resumes_from_the_one_before(tmp_path):
    """3 sync steps, a checkpoint after each; the disk fills while step 2's is written: the run
    fails in one line, steps 0 and 1 committed. Then 256 bytes of step 1's model are overwritten
    at the same size: --resume names it, continues from step 0's, trains steps 1 and 2 again."""
    out, config, inject = tmp_path / "out", tmp_path / "small.yaml", tmp_path / "inject"
    small = yaml.safe_load(Path("configs/quickstart.yaml").read_text())
    small["task"]["tool_latency"] = {"distribution": "none"}
    small["rollout"]["max_new_tokens"] = 12
    small["train"].update(prompts_per_step=2, group_size=2, schedule="sync")
    config.write_text(yaml.safe_dump(small))
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(FULL_DISK_AT)
    full_disk = {**os.environ, "THUNDERSYNC_TEST_FULL_AT": ".tmp-step-000002-",
                 "PYTHONPATH": os.pathsep.join([str(inject), os.environ.get("PYTHONPATH", "")])}
    procs = []
    try:
        procs.append(subprocess.Popen(CLI + ["train", "--quiet", "--config", str(config), "--steps", "3",
                                             "--checkpoint-every", "1", "--output", str(out)],
                                      stderr=subprocess.PIPE, text=True, start_new_session=True, env=full_disk))
        full_err = procs[0].communicate(timeout=300)[1]
        assert procs[0].returncode == 1 and "Traceback" not in full_err, full_err
        assert full_err.strip().splitlines()[-1] == (f"thundersync: run failed: cannot write the checkpoint "
                                                     f"{out}/checkpoints/step-000002: No space left on device")
        newest = list_checkpoints(out)[-1]
        assert newest.name == "step-000001" and not list((out / "checkpoints").glob(".tmp-*"))
        overwrite_same_size(newest / "model.safetensors", offset=4096)
        procs.append(subprocess.Popen(CLI + ["train", "--quiet", "--resume", str(out)], stderr=subprocess.PIPE,
                                      text=True, start_new_session=True))
        resumed_err = procs[1].communicate(timeout=300)[1]
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert procs[1].returncode == 0, resumed_err
    skipped = [line for line in resumed_err.splitlines() if "damaged checkpoint" in line]
    assert len(skipped) == 1 and str(newest) in skipped[0] and "Traceback" not in resumed_err
    trained = [line.split()[1] for line in resumed_err.splitlines() if line.startswith("step ")]
    assert trained == ["1", "2"], resumed_err  # from step 0's checkpoint
    assert [p.name for p in list_checkpoints(out)] == ["step-000000", "step-000001", "step-000002"]
    assert all(damage(path) is None for path in list_checkpoints(out))
