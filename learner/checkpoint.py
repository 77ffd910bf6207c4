"""Checkpoints of a training run, and what resuming reads back (docs/checkpoints.md).

An output directory (``thundersync train --output DIR``) holds::

    DIR/run.yaml                      the run's config as trained (``--resume DIR`` reads it)
    DIR/checkpoints/step-000002/      after step 2 (0-based): the state at that step boundary
        model.safetensors             every tensor of the policy's state dict
        optimizer.pt                  the optimizer's state dict (AdamW moments, step counts)
        state.json                    counters, RNG states, the schedule's state (``RunState``)
        behavior.safetensors          async: the weights the batch in flight was sampled with
        committed.json                written last: the size and sha256 of every file above (``COMMITTED``)
    DIR/config.json, DIR/model.safetensors, tokenizer files    the final policy (Hugging Face)

A checkpoint is written into a temporary directory next to its final name, its files
fsynced, its commit marker written last, and renamed into place (a rename is atomic on one
filesystem). A checkpoint counts (``list_checkpoints``, hence ``--resume`` and the web
app's resume) only when its marker is there and every file it lists has its size: a run
killed while writing leaves a ``.tmp-*`` directory, never a torn ``step-*`` one, and a
checkpoint that is replaced or pruned is first renamed out of the ``step-*`` names, so a
kill halfway through deleting it cannot leave a partial one behind either.
``remove_uncommitted`` sweeps what such kills leave; only the last ``keep`` are kept.
A committed checkpoint can still be damaged later (a disk, a hand): what resumes verifies
its content first (learner/checkpoint_integrity.py).
"""

from __future__ import annotations

# torch is imported where it is used: the CLI looks for checkpoints before it imports torch

import hashlib
import json
import os
import random
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

CHECKPOINTS = "checkpoints"
RUN_CONFIG = "run.yaml"
PREFIX = "step-"
COMMITTED = "committed.json"


@dataclass
class RunState:
    """What a step boundary needs beyond the weights and the optimizer to continue the run
    as if it had never stopped."""

    steps_done: int  # the next step to train is this one
    version: int  # policy version (optimizer steps taken)
    seq: int  # next span seq
    clock: float  # run clock (seconds since the run started) at the boundary
    next_traj: int
    next_group: int
    rewards: list[float] = field(default_factory=list)
    schedule: dict[str, Any] = field(default_factory=dict)  # the schedule's in-flight state (driver)
    torch_rng: list[int] = field(default_factory=list)
    python_rng: list[Any] = field(default_factory=list)

    @classmethod
    def capture_rng(cls) -> dict[str, list]:
        import torch

        state = random.getstate()
        return {"torch_rng": torch.get_rng_state().tolist(), "python_rng": [state[0], list(state[1]), state[2]]}

    def restore_rng(self) -> None:
        import torch

        if self.torch_rng:
            torch.set_rng_state(torch.tensor(self.torch_rng, dtype=torch.uint8))
        if self.python_rng:
            version, internal, gauss = self.python_rng
            random.setstate((version, tuple(internal), gauss))


def checkpoint_dir(out_dir: str | Path, steps_done: int) -> Path:
    return Path(out_dir) / CHECKPOINTS / f"{PREFIX}{steps_done - 1:06d}"


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


BEHAVIOR = "behavior.safetensors"


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (a full disk, a read-only or vanished directory): one
    line naming it; what was half written is removed."""


def save_checkpoint(out_dir: str | Path, model, optimizer, state: RunState, keep: int,
                    behavior: dict | None = None) -> Path:
    """Write the checkpoint of the boundary after step ``state.steps_done - 1``; returns its path.
    ``behavior``: async's in-flight batch's sampling weights (``BEHAVIOR``), when there is one."""
    import torch
    from safetensors.torch import save_file

    final = checkpoint_dir(out_dir, state.steps_done)
    final.parent.mkdir(parents=True, exist_ok=True)
    for stale in final.parent.glob(".tmp-*"):  # a run killed while writing (one writer per directory)
        shutil.rmtree(stale, ignore_errors=True)
    tmp = final.parent / f".tmp-{final.name}-{os.getpid()}"
    try:
        tmp.mkdir()
        tensors = {name: t.detach().to("cpu").contiguous() for name, t in model.state_dict().items()}
        save_file(tensors, str(tmp / "model.safetensors"))
        if behavior is not None:
            save_file(behavior, str(tmp / BEHAVIOR))
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        (tmp / "state.json").write_text(json.dumps(asdict(state)))
        _commit(tmp)
    except Exception as err:  # noqa: BLE001 - a full disk surfaces as OSError, safetensors' or torch's own error
        shutil.rmtree(tmp, ignore_errors=True)  # the committed checkpoints before it stay as they are
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err).strip().splitlines()[0]
        raise CheckpointWriteError(f"cannot write the checkpoint {final}: {reason}") from err
    if final.exists():  # a resumed run that passes the same step again
        discard(final)
    os.rename(tmp, final)
    _fsync_dir(final.parent)
    for old in list_checkpoints(out_dir)[:-keep]:
        discard(old)
    return final


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _commit(tmp: Path) -> None:
    """fsync every file of ``tmp``, then write (and fsync) the marker listing their sizes and
    sha256 digests (read back from the file: what resume verifies, learner/checkpoint_integrity.py).
    ``files`` keeps the sizes alone, so a reader that predates the digests still reads it."""
    sizes, digests = {}, {}
    for f in sorted(tmp.iterdir()):
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
        sizes[f.name] = f.stat().st_size
        digests[f.name] = file_sha256(f)
    with open(tmp / COMMITTED, "w") as fh:
        json.dump({"files": sizes, "sha256": digests}, fh)
        fh.flush()
        os.fsync(fh.fileno())


LEGACY_FILES = ("model.safetensors", "optimizer.pt", "state.json")


def committed(path: Path) -> bool:
    """Whether checkpoint directory ``path`` was committed whole: its marker is there and
    every file it lists has the size written. A directory without any marker was written
    before markers existed, also by a temporary directory and a rename, so it counts when
    its files are all there and its state parses (``_legacy_whole``): resuming never deletes
    a user's older checkpoints."""
    if not (path / COMMITTED).exists():
        return _legacy_whole(path)
    try:
        sizes = json.loads((path / COMMITTED).read_text())["files"]
        return "state.json" in sizes and all((path / name).stat().st_size == size for name, size in sizes.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def _legacy_whole(path: Path) -> bool:
    """A marker-less checkpoint: whole unless a kill halfway through deleting it took files."""
    try:
        if not all((path / name).is_file() and (path / name).stat().st_size > 0 for name in LEGACY_FILES):
            return False
        json.loads((path / "state.json").read_text())["steps_done"]
        return True
    except (OSError, ValueError, KeyError, TypeError):
        return False


def discard(path: Path) -> None:
    """Remove checkpoint ``path``: renamed out of the ``step-*`` names first (atomic), then deleted."""
    gone = path.parent / f".tmp-discard-{path.name}-{os.getpid()}"
    try:
        os.rename(path, gone)
    except OSError:
        return
    shutil.rmtree(gone, ignore_errors=True)


def remove_uncommitted(out_dir: str | Path) -> list[str]:
    """Delete what kills left under ``out_dir``'s checkpoints (``.tmp-*`` directories, and
    ``step-*`` ones without a whole commit); returns their names. Only while no run writes there."""
    root = Path(out_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    stale = [p for p in sorted(root.iterdir()) if p.is_dir() and not p.is_symlink()
             and (p.name.startswith(".tmp-") or (p.name.startswith(PREFIX) and not committed(p)))]
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return [p.name for p in stale]


def list_checkpoints(out_dir: str | Path) -> list[Path]:
    """Committed checkpoints (``committed``), oldest first; temporary directories and torn
    ones are not checkpoints."""
    root = Path(out_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.name.startswith(PREFIX) and committed(p))


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    found = list_checkpoints(out_dir)
    return found[-1] if found else None


def load_checkpoint(path: str | Path) -> tuple[dict, dict, RunState]:
    """(model state dict, optimizer state dict, run state) of checkpoint ``path``."""
    import torch
    from safetensors.torch import load_file

    path = Path(path)
    tensors = load_file(str(path / "model.safetensors"))
    optim = torch.load(path / "optimizer.pt", weights_only=True)
    state = RunState(**json.loads((path / "state.json").read_text()))
    return tensors, optim, state


def load_behavior(path: str | Path) -> dict | None:
    """Checkpoint ``path``'s async sampling weights (``BEHAVIOR``), or None."""
    from safetensors.torch import load_file

    found = Path(path) / BEHAVIOR
    return load_file(str(found)) if found.is_file() else None


def write_run_config(out_dir: str | Path, config: dict) -> None:
    """The run's config as trained, for ``--resume`` (written atomically)."""
    import yaml

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{RUN_CONFIG}.{os.getpid()}"
    tmp.write_text(yaml.safe_dump(config, sort_keys=False))
    os.replace(tmp, out / RUN_CONFIG)


def save_final_model(save, out_dir: str | Path) -> Path:
    """Write the final policy with ``save(directory)`` into a temporary directory, then move
    its files into ``out_dir`` (each move a rename): a reader never sees a torn model file."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".tmp-final-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    save(tmp)
    for item in sorted(tmp.iterdir()):
        target = out / item.name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        os.replace(item, target)
    tmp.rmdir()
    return out
