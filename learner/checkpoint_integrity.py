"""Which checkpoint a run resumes from: the newest one whose content is intact
(docs/checkpoints.md, "Verified by content").

``committed`` (learner/checkpoint.py) only says a checkpoint was written whole: its marker
is there and every file has its size. A file can still change afterwards (a failing disk,
a hand or a program with write access) without changing its size. So before a run resumes,
``newest_intact`` checks the newest committed checkpoint by content and walks back to older
ones while they are damaged:

- a checkpoint whose marker records sha256 digests: every file must match its digest, and
  ``state.json`` must be a well-formed ``RunState``;
- an older one, written before the digests (its marker has sizes only, or it has no marker
  at all): there is nothing to compare against, so it is loaded whole (the tensors, the
  optimizer state, the state) and counts when that succeeds. Bytes changed inside a tensor
  of such a checkpoint cannot be told apart from trained ones.

A damaged checkpoint is moved out of the ``step-*`` names into ``checkpoints/damaged/``
(kept for whoever wants to look at it; never pruned into, never resumed from), so the
resumed run's pruning by ``train.keep_checkpoints`` cannot delete the intact ones in favour
of it. One line per damaged checkpoint says which and why.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from learner.checkpoint import (BEHAVIOR, CHECKPOINTS, COMMITTED, RunState, file_sha256, list_checkpoints,
                                load_behavior, load_checkpoint)

DAMAGED = "damaged"
_INT_FIELDS = ("steps_done", "version", "seq", "next_traj", "next_group")


def state_problem(text: str) -> str | None:
    """Why ``text`` is not a ``RunState`` as the learner writes it, or None."""
    try:
        raw = json.loads(text)
    except ValueError as err:
        return f"not JSON ({err})"
    if not isinstance(raw, dict):
        return "not a JSON object"
    try:
        state = RunState(**raw)
    except TypeError as err:
        return str(err).replace("RunState.__init__() ", "")
    for name in _INT_FIELDS:
        value = getattr(state, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            return f"{name} = {value!r} is not a count"
    if not isinstance(state.clock, (int, float)) or not isinstance(state.rewards, list):
        return "clock or rewards of the wrong type"
    return None


def damage(path: Path, load_unverified: bool = True) -> str | None:
    """Why checkpoint ``path`` cannot be resumed from (one line), or None when it is intact.
    ``load_unverified=False``: a checkpoint without digests is judged by its ``state.json``
    alone, without importing torch (the web app's worker; the learner loads it whole)."""
    try:
        marker = json.loads((path / COMMITTED).read_text()) if (path / COMMITTED).exists() else {}
        digests = marker.get("sha256")
        if digests is None and not load_unverified:
            problem = state_problem((path / "state.json").read_text())
            return f"state.json: {problem}" if problem else None
        if digests is None:
            return _unverifiable_loads(path)
        for name in sorted(set(marker["files"]) | set(digests)):
            if name not in digests:
                return f"{name} has no sha256 in {COMMITTED}"
            if file_sha256(path / name) != digests[name]:
                return f"{name} does not match its sha256 in {COMMITTED} (changed after it was written)"
        problem = state_problem((path / "state.json").read_text())
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        return f"unreadable: {type(err).__name__}: {err}".splitlines()[0]
    return f"state.json: {problem}" if problem else None


def _unverifiable_loads(path: Path) -> str | None:
    """A checkpoint without digests: intact as far as loading all of it can tell."""
    try:
        problem = state_problem((path / "state.json").read_text())
        if problem:
            return f"state.json: {problem}"
        load_checkpoint(path)
        if (path / BEHAVIOR).exists():
            load_behavior(path)
    except Exception as err:  # noqa: BLE001 - any failure to load is the reason it cannot be resumed from
        return f"cannot be loaded: {type(err).__name__}: {err}".splitlines()[0]
    return None


def set_aside(path: Path) -> Path:
    """Move damaged checkpoint ``path`` to ``checkpoints/damaged/<name>`` (one rename)."""
    target = path.parent / DAMAGED / path.name
    target.parent.mkdir(exist_ok=True)
    if target.exists():  # the same step damaged again in a later attempt: the newer evidence wins
        shutil.rmtree(target, ignore_errors=True)
    os.rename(path, target)
    return target


def newest_intact(out_dir: str | Path, report: Callable[[str], None]) -> Path | None:
    """The newest committed checkpoint of ``out_dir`` that is intact (``damage``); each
    damaged one newer than it is set aside and reported in one line. None: none is intact."""
    for path in reversed(list_checkpoints(out_dir)):
        reason = damage(path)
        if reason is None:
            return path
        moved = set_aside(path)
        report(f"skipped the damaged checkpoint {path}: {reason}; moved to {moved}")
    return None


def damaged_dir(out_dir: str | Path) -> Path:
    return Path(out_dir) / CHECKPOINTS / DAMAGED
