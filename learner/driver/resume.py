"""Checkpoints of the driver loop, and continuing a run from one (docs/checkpoints.md).

A checkpoint is the state at a step boundary (``Trainer.after_step``): the optimizer has
stepped and published, nothing is half-learnt. What the rollout fleet has in flight then
is not saved but replayed: sync and streaming dispatch the next batch right after the
publish, and its trajectories (ids, prompts, sampling seeds) are a function of the step
and the run seed, so the resumed run dispatches the same batch again and samples the same
tokens from the same weights. async's next batch was sampled from the weights before the
last step: the checkpoint holds those too (``behavior.safetensors``), and the resumed run
publishes them for that one batch, then the checkpoint's own. fully-async's admitted groups
are dropped and new groups admitted in their place (new prompts). Everything else (model,
optimizer, counters, RNG states, reward curve, span numbering, run clock) continues exactly.

A run stopped by SIGTERM/SIGINT mid-step writes the checkpoint of the boundary before the
step it was in (the model and the optimizer have not moved since; the RNG states are the
ones saved at that boundary).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from learner.checkpoint import RunState, load_behavior, load_checkpoint, save_checkpoint


@dataclass
class ResumePoint:
    """Where a run continues from: a checkpoint directory, and the first span seq and run
    clock the continued run may use (a controller that stored later spans of the stopped
    attempt passes them so the timeline never goes back)."""

    path: Path
    seq_from: int = 0
    clock_from: float = 0.0

    def load(self):
        return load_checkpoint(self.path)


def weights_loader(point: ResumePoint | None):
    """For ``build_run``: load the checkpoint's model and optimizer state before the weight
    store and the fleet are built from the model; returns the policy version (0: fresh)."""
    if point is None:
        return None
    tensors, optim, state = point.load()

    def load(model, optimizer) -> int:
        model.load_state_dict(tensors)
        optimizer.load_state_dict(optim)
        return state.version

    return load


class Checkpointer:
    """Writes the checkpoints of one run (``train.checkpoint_every``) and reports each as a
    ``{"type": "checkpoint", "step", "path"}`` event."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.every = trainer.cfg.train.checkpoint_every
        self.rng = RunState.capture_rng()  # as of the last boundary
        # async: (batch, the published weights it is sampled with) of the batch in flight; a
        # resumed run samples its first batch again from the checkpoint's (``replay``: their version)
        self.behavior: tuple[int, dict] | None = None
        self.replay: int | None = None
        weights = load_behavior(trainer.resume.path) if trainer.resume else None
        if weights is not None:
            self.behavior, self.replay = (trainer.first_step, weights), trainer.version - 1
            trainer.parts.publish(self.replay, weights)

    def dispatch_version(self, batch: int) -> int:
        """The policy version batch ``batch`` is sampled with (a resumed async run: its first
        batch at the checkpoint's behaviour version)."""
        return self.replay if self.replay is not None and self.behavior[0] == batch else self.trainer.version

    def dispatched(self, batch: int) -> None:
        """Batch ``batch`` went out: after a replayed one the store gets the policy's weights
        back; async with checkpoints keeps what the replicas sample it with."""
        t = self.trainer
        if self.replay is not None:
            self.replay = None
            t.parts.publish(t.version)
        elif self.every and t.schedule.keeps_behavior:
            self.behavior = (batch, {n: x.clone() for n, x in t.parts.store.tensors.items()})

    def at_boundary(self, steps_done: int) -> None:
        self.rng = RunState.capture_rng()
        last = steps_done == self.trainer.cfg.train.steps
        if self.every and (steps_done % self.every == 0 or last):
            self.save(steps_done)

    def on_stop(self, steps_done: int) -> None:
        """A signal stopped the run inside step ``steps_done``: keep the boundary before it."""
        if self.every and steps_done > 0:
            self.save(steps_done)

    def save(self, steps_done: int) -> Path:
        t = self.trainer
        state = capture(t, steps_done, self.rng)
        behavior = self.behavior[1] if self.behavior and self.behavior[0] == steps_done else None
        path = save_checkpoint(t.cfg.train.output_dir, t.model, t.parts.optimizer, state, t.cfg.train.keep_checkpoints,
                               behavior)
        t.sink.emit({"type": "checkpoint", "step": steps_done - 1, "path": str(path)})
        return path


def capture(t, steps_done: int, rng: dict) -> RunState:
    """The state of trainer ``t`` at the boundary after ``steps_done`` steps."""
    P = t.cfg.train.prompts_per_step
    next_traj, next_group = t.schedule.next_numbers(t.rollouts, steps_done)
    return RunState(
        steps_done=steps_done, version=t.version, seq=t.recorder.seq, clock=t.now(), next_traj=next_traj,
        next_group=next_group, rewards=list(t.rewards[:steps_done]), schedule={"groups_taken": steps_done * P},
        **rng,
    )


def restore(t, point: ResumePoint) -> RunState:
    """Put trainer ``t`` at the checkpoint's boundary, before its set-up (the workers take
    the run clock's origin at set-up). ``continue_after_setup`` sets the rollout counters and
    the RNG states once the models are built (that seeds torch)."""
    _, _, state = point.load()
    t.version, t.rewards = state.version, list(state.rewards)
    t.recorder.seq = max(state.seq, point.seq_from)
    t.recorder.origin = time.monotonic() - max(state.clock, point.clock_from)
    t.schedule.restore(state)
    return state


def continue_after_setup(t, state: RunState | None) -> int:
    """Once trainer ``t`` has its ``Rollouts`` and models (``build_run`` seeded torch): the
    checkpoint's rollout counters and RNG states; returns the first step to train (0: fresh)."""
    if state is None:
        return 0
    t.rollouts.next_traj, t.rollouts.next_group = state.next_traj, state.next_group
    state.restore_rng()
    return state.steps_done
