"""The training driver: one loop for every schedule (docs/schedules.md).

    dispatch -> collect the step (learning on arrival where the schedule does) -> dispatch
    -> the learner's barrier work -> optimizer step -> publish -> metrics -> checkpoint

``Trainer.run`` is the one loop; what differs between the schedules is one object,
``driver/schedules.py``, deciding through ``driver/rules.py`` (shared with the simulator):
what may be dispatched now (``dispatch``), what is learnt the moment it arrives and when a step
forms (``collect``), whether a publish waits for every replica (``publish_waits``). The
learner is whichever ``Learner`` the schedule needs (``driver/setup.py``); it owns its
optimizer step.

The learner runs in this process (pinned to core 0, one torch thread); rollout workers run
in their own processes on the other cores (docs/processes.md). Everything that happens is a
span; per-step metrics are a function of the spans of the step's window (driver/metrics.py).
"""

from __future__ import annotations

import gc
import resource
import time
from pathlib import Path
from typing import Any, Callable

from learner import stopping
from learner.checkpoint import save_final_model
from learner.config import RunConfig
from learner.distributed.front import rank_lane, uses_ranks
from learner.distributed.node_rollouts import rollout_hosts
from learner.driver.barrier import AuditDump, Barrier
from learner.driver.curves import learner_curves, trajectory_curves
from learner.driver.metrics import StepRecord, step_metrics
from learner.driver.recorder import Recorder
from learner.driver.resume import Checkpointer, ResumePoint, continue_after_setup, restore, weights_loader
from learner.driver.rollouts import Rollouts
from learner.driver.speculation_gate import measure as measure_gate
from learner.driver.speculation_metrics import busy_share, speculation_metrics
from learner.driver.schedules import make_schedule
from learner.driver.setup import RunParts, build_run
from learner.driver.system_metrics import ProcessSampler, SystemSampler, gpu_metrics, placed_gpu_metrics, run_pids
from learner.driver.trajectory_records import TrajectoryRecords
from learner.lora import grad_buffer_mb, save_policy
from learner.rollout.processes.boot import BootedWorkers, boot_fleet
from learner.timeline import EventSink, Metric, StepMetrics
from learner.trajectory import ScoredTurn, Trajectory


class Trainer:
    def __init__(self, cfg: RunConfig, sink: EventSink, dump: tuple[str, int] | None = None,
                 on_step: Callable[[dict], None] | None = None, resume: ResumePoint | None = None):
        self.cfg, self.sink, self.on_step, self.resume = cfg, sink, on_step, resume
        self.audit = AuditDump(dump[0], dump[1], cfg) if dump else None
        self.schedule = make_schedule(cfg)  # with its in-flight state: what a checkpoint of it holds
        self.recorder = Recorder(sink, rank_lane(0, cfg.learner.node_of(0)))
        self.version, self.rewards = 0, []
        self.processes = ProcessSampler()

    def now(self) -> float:  # the run clock
        return self.recorder.now()

    def on_phase(self, kind: str, t0: float, t1: float, traj, group, rank: int = 0) -> None:
        """Learner phase callback (raw time.monotonic() stamps); other ranks on their own lanes."""
        self.recorder.phase(kind, t0, t1, self.version, traj, group, rank_lane(rank, self.cfg.learner.node_of(rank)))

    def setup(self, booted: BootedWorkers) -> None:
        resumed = restore(self, self.resume) if self.resume else None  # before the workers take the clock
        self.parts = build_run(self.cfg, booted, self.recorder.origin,
                               lambda rank, *phase: self.on_phase(*phase, rank=rank), weights_loader(self.resume))
        self.model, self.policy_dir, self.learner = self.parts.model, self.parts.policy_dir, self.parts.learner
        self.rollouts = Rollouts(self.cfg, self.parts.fleet, self.parts.env, self.recorder)
        self.barrier = Barrier(self.parts, self.recorder, self.rollouts, self.audit)
        self.first_step = continue_after_setup(self, resumed)
        self.checkpoints = Checkpointer(self)
        self.records = TrajectoryRecords(self.sink, self.parts.tokenizer, self.cfg.algorithm)
        nodes = 1 + len(rollout_hosts(self.cfg))  # every node runs as many workers as this one
        self.workers = len(booted.cmd_qs) * nodes
        self.sink.emit(started_event(self.cfg, self.parts, self.workers, self.now()))

    def learn(self, items: list[Trajectory | ScoredTurn]) -> None:
        """Hand the learner everything waiting; it decides how to batch it (docs/learner.md)."""
        for item in items:
            self.recorder.expect_backward(item)
        if items:
            self.learner.learn(items, on_phase=self.on_phase)

    def train_step(self, held: list[Trajectory | ScoredTurn]) -> None:
        """The learner's work for the step that formed: what was held (sync: all of it, turns
        first; streaming OPD: the trajectories that close the turn accounting; off-policy: the
        whole batch, learnt in ``finish_batch``), then the barrier."""
        self.learn(sorted(held, key=learn_order))  # arrival order would reach the float sums
        self.rec.learner_stats = self.learner.finish_batch(self.on_phase)
        self.version = self.barrier(self.rec, self.version, wait_for_replicas=self.schedule.publish_waits)

    def finish_step(self, t_end: float) -> dict:
        """Metrics of the step that ended at ``t_end`` (its publish). The next step starts
        there too (``self.t_step_end``), so steps tile the run: bookkeeping after a publish
        belongs to the next step, never to no step."""
        rec = self.rec
        self.t_step_end, rec.first_backward = t_end, self.recorder.first_backward
        self.rollouts.drain_spans()
        spans, waits = self.recorder.window(rec.t_start, t_end, rec.trajs)
        values = step_metrics(rec, spans, t_end, waits, self.version, self.schedule.name, memory_mb(self.parts, rec))
        values.update(run_metrics(self.parts, rec, spans, t_end))
        values.update(self.curves(rec))
        values[Metric.ROLLOUT_BUSY_SHARE] = busy_share(spans, rec.t_start, t_end, self.workers)
        if self.cfg.rollout.speculation.enabled:
            values.update(speculation_metrics(rec.trajs, spans, rec.t_start, t_end))
            self.rollouts.gate.observe(measure_gate(rec.trajs, spans, rec.t_start, t_end), rec.step)
            values.update(self.rollouts.gate.report(rec.step))
        self.sink.emit(StepMetrics(rec.step, values))
        self.records.submit(rec.step, rec.trajs)  # decoded off the learner's thread
        self.rewards.append(values[Metric.REWARD_MEAN])
        if self.on_step:
            self.on_step({"step": rec.step, **values})
        return values

    def curves(self, rec: StepRecord) -> dict[str, float]:
        """Reward spread, response lengths, loss terms, learning rate and the processes' CPU and
        memory over the step (learner/driver/curves.py, system_metrics.py)."""
        groups = self.parts.optimizer.param_groups if self.parts.optimizer is not None else []
        ranks = getattr(self.parts.learner, "rank_stats", None)  # data-parallel: every rank's share
        per_rank = list(ranks.values()) if ranks else [rec.learner_stats]
        values = {**trajectory_curves(rec.trajs), **learner_curves(per_rank, groups[0]["lr"] if groups else None)}
        values.update(self.processes.sample(self.run_pids()))
        values.update(self.gpu_values())
        return values

    def gpu_values(self) -> dict[str, float]:
        values = gpu_metrics(self.parts.params[0].device)
        if self.cfg.placement is not None:  # each placed GPU's role, memory and utilisation (docs/gpu.md)
            values.update(placed_gpu_metrics(self.cfg.placement))
        return values

    def start_system_sampler(self) -> SystemSampler | None:
        """``tracking.system_every_s``: the processes sampled on the wall clock too, not only at
        step ends (learner/driver/system_metrics.py)."""
        every_s = self.cfg.tracking.system_every_s
        if every_s <= 0:
            return None
        return SystemSampler(every_s, self.now, self.run_pids, self.sink.emit, self.gpu_values).start()

    def run_pids(self) -> dict[str, int]:
        fleet = getattr(self.parts.fleet, "local", self.parts.fleet)  # PlacedFleet: this node's workers
        return run_pids(self.parts.learner.pids, fleet.booted.procs)

    def run(self) -> dict:
        system = None
        try:
            self.processes.sample(self.run_pids())  # the first step's CPU % is over the step
            system = self.start_system_sampler()
            self.t_step_end = self.now()
            self.schedule.dispatch(self)
            for step in range(self.first_step, self.cfg.train.steps):
                self.rec = StepRecord(step, self.t_step_end)
                # a step boundary is a safe point too: a stop requested during the last step takes
                # effect here, not only where the learner next waits for the fleet (with messages
                # always queued, a streaming run might not wait for many steps)
                stopping.check()
                self.recorder.begin_step(step)
                self.parts.fleet.begin_step(step)  # rollout.max_worker_restarts counts per step
                held = self.schedule.collect(self)
                self.schedule.dispatch(self)  # async: the next batch rolls out while this one trains
                self.train_step(held)
                published = self.now()
                self.schedule.after_publish(self)
                self.finish_step(t_end=published)
                self.after_step(step)
            self.schedule.end(self)
        except stopping.Interrupted:  # keep the boundary before the step it stopped in
            self.checkpoints.on_stop(self.rec.step if hasattr(self, "rec") else self.first_step)
            self.records.close(wait_for_them=False)
            raise
        except BaseException:
            self.records.close(wait_for_them=False)
            raise
        finally:
            if system is not None:
                system.stop()
            self.parts.close()
        return finish_run(self)

    def after_step(self, step: int) -> None:
        """The step boundary: nothing in flight is half-learnt (the optimizer stepped and
        published), so this is where a run may checkpoint, evaluate or stop
        (docs/architecture.md, "Driver seams")."""
        self.checkpoints.at_boundary(step + 1)


def finish_run(trainer: Trainer) -> dict:
    """The end of a run that trained every step: the final model (``train.output_dir``), then
    the summary as the run's terminal event."""
    trainer.records.close()  # the last steps' trajectory texts before the terminal event
    if trainer.cfg.train.output_dir:
        save_final_model(lambda tmp: save_policy(trainer.model, trainer.parts.tokenizer, tmp),
                         trainer.cfg.train.output_dir)
    summary = {"steps": trainer.cfg.train.steps, "schedule": trainer.schedule.name, "reward_curve": trainer.rewards,
               "final_version": trainer.version, "spans": trainer.recorder.seq, "wall_s": trainer.now()}
    trainer.sink.emit({"type": "run", "status": "finished", "summary": summary, "t": trainer.now()})
    return summary


def started_event(cfg: RunConfig, parts: RunParts, workers: int, now: float) -> dict:
    return {"type": "run", "status": "started", "t": now, "config": cfg.model_dump(),
            "origin_epoch": time.time() - now,  # wall clock at run-clock 0 (pages, benches)
            "policy_dir": str(parts.policy_dir), "workers": workers,
            **({"learner_rank_pids": parts.learner.pids} if uses_ranks(cfg) else {})}


def run_metrics(parts: RunParts, rec: StepRecord, spans: list[dict], t_end: float) -> dict[str, float]:
    """Metrics a run's set-up adds: per learner rank (data-parallel) and held-out evaluation
    (``train.eval_every``, after the step's publish)."""
    values = parts.learner.metrics(spans, rec.t_start, t_end)
    if parts.evaluator is not None and parts.evaluator.due(rec.step):
        values.update(parts.evaluator.run(rec.step))
    return values


def memory_mb(parts: RunParts, rec: StepRecord) -> dict[str, float]:
    """The process's peak RSS and the accumulators' memory (adapter-sized under LoRA)."""
    memory = {Metric.PEAK_RSS_MB: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}
    if "peak_buffers" in rec.learner_stats:
        memory[Metric.GRAD_BUFFERS_MB] = grad_buffer_mb(parts.params, rec.learner_stats["peak_buffers"])
    return memory


def learn_order(item: Trajectory | ScoredTurn) -> tuple:
    """What a step learns at its barrier, in an order that does not depend on arrival
    (turns before trajectories, then by trajectory and turn): float sums in a fixed order
    make a sync run, and one resumed from a checkpoint, reproducible bit for bit."""
    if isinstance(item, ScoredTurn):
        return (0, item.traj, item.turn)
    return (1, item.id, 0)


def train(cfg: RunConfig, sink: EventSink, dump_dir: str | Path | None = None,
          on_step: Callable[[dict], None] | None = None, booted: BootedWorkers | None = None,
          dump_at: int = 0, resume: ResumePoint | None = None) -> tuple[Trainer, dict[str, Any]]:
    """Run ``cfg`` to completion; returns the trainer (model, optimizer) and a summary.
    ``dump_dir``: write step ``dump_at``'s audit dump there (learner/audit.py); ``booted``:
    the run's rollout workers, from ``boot_fleet(cfg)`` (spawned here when None); ``resume``:
    continue from a checkpoint (learner/driver/resume.py)."""
    trainer = Trainer(cfg, sink, (str(dump_dir), dump_at) if dump_dir else None, on_step, resume)
    booted = booted or boot_fleet(cfg)
    try:
        trainer.setup(booted)
    except BaseException:  # after build_run its fleet owns the workers: run() will not stop them
        parts = getattr(trainer, "parts", None)
        if parts is not None:
            parts.close()
        raise
    finally:
        booted.close()  # only if setup failed before its fleet took the workers over
    try:
        return trainer, trainer.run()
    finally:
        gc.unfreeze()
