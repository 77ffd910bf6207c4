"""The training driver: one loop, four schedules (DESIGN §4).

    sync        dispatch batch s -> wait for its last reward -> learn -> step -> publish
    streaming   dispatch batch s -> learn each trajectory (GRPO) / turn (OPD) as it arrives
                -> barrier -> step -> publish                              (staleness 0)
    async       batch s+1 rolls out with weights s while the learner trains batch s (staleness 1)
    fully-async rollout never waits: workers pick up new weights between turns; the learner
                steps whenever a batch of groups is complete (staleness <= max_staleness)

The learner runs in this process (pinned to core 0, one torch thread); rollout workers run
in their own processes on the other cores. Everything that happens is a span; per-step
metrics are derived from the spans of the step's wall-clock window.
"""

from __future__ import annotations

import gc
import resource
from collections import deque
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from learner import stopping
from learner.checkpoint import save_final_model
from learner.config import RunConfig
from learner.driver.resume import Checkpointer, ResumePoint, restore, weights_loader
from learner.gradients import OffPolicyLearner, StreamingLearner
from learner.evaluation import Evaluator
from learner.lora import grad_buffer_mb, publish_view, save_policy, with_lora
from learner.mismatch import check_sampled_versions, step_mismatch
from learner.rollout.env import make_env, task_for_group, task_metrics
from learner.rollout.chat import turn_stop_ids
from learner.rollout.fleet import Fleet
from learner.rollout.models import load_model, load_tokenizer, resolve_model_dir
from learner.rollout.weights import WeightStore
from learner.rollout.boot import BootedWorkers, boot_fleet
from learner.rollout.cores import core_plan
from learner.rollout.worker import pin_to_core
from learner.timeline import EventSink, Span, StepMetrics, union_length, window_metrics
from learner.trajectory import ScoredTurn, Trajectory

LEARNER_LANE = "learner/0"


@dataclass
class StepRecord:
    """What one optimizer step consumed, for its metrics."""

    step: int
    t_start: float
    trajs: list[Trajectory] = field(default_factory=list)
    trained_version: int = 0
    first_backward: float | None = None
    learner_stats: dict = field(default_factory=dict)
    mismatch: dict = field(default_factory=dict)
    dropped_groups: int = 0  # fully-async: groups found too stale during this step


class Trainer:
    def __init__(self, cfg: RunConfig, sink: EventSink, dump_dir: str | None = None,
                 on_step: Callable[[dict], None] | None = None, resume: ResumePoint | None = None):
        self.cfg, self.sink, self.dump_dir, self.on_step, self.resume = cfg, sink, dump_dir, on_step, resume
        self.origin = time.monotonic()
        self.seq = 0
        self.recent: list[dict] = []  # span events still inside a step window (metrics)
        self.pending: deque = deque()  # trajectories/turns read early (while draining spans)
        self.waits: list[tuple[float, float]] = []  # run-clock intervals blocked on the fleet for data
        self.version = 0
        self.next_traj = 0
        self.next_group = 0
        self.rewards: list[float] = []
        self.dispatch_versions: dict[int, int] = {}  # step -> fleet version its batch was sampled with

    # -- clock and spans -----------------------------------------------------------
    def now(self) -> float:
        return time.monotonic() - self.origin

    def emit_span(self, span: Span | dict) -> None:
        """Number the span and pass it on; worker spans arrive as dicts and stay dicts (this
        runs on the learner's core, once per span)."""
        event = span.to_event() if isinstance(span, Span) else {"type": "span", **span}
        event["seq"] = self.seq
        self.seq += 1
        self.sink.emit(event)
        self.recent.append(event)

    def learner_span(self, kind: str, t0: float, t1: float, traj=None, group=None, tokens=0) -> None:
        self.emit_span(Span(step=self.rec.step, kind=kind, t0=t0, t1=t1, lane=LEARNER_LANE, traj=traj,
                            group=group, policy_version=self.version, tokens=tokens))

    def on_phase(self, kind: str, t0: float, t1: float, traj, group) -> None:
        """Learner phase callback; stamps are raw time.monotonic()."""
        t0, t1 = t0 - self.origin, t1 - self.origin
        if kind == "learner.backward" and self.rec.first_backward is None:
            self.rec.first_backward = t0
        self.learner_span(kind, t0, t1, traj, group)

    # -- set-up --------------------------------------------------------------------
    def setup(self, booted: BootedWorkers) -> None:
        """Load the models, build the learner and the weight store, start the rollout fleet
        (``booted``: its workers, spawned by ``boot_fleet`` as early as possible, so they
        import torch beside us)."""
        cfg = self.cfg
        resumed = restore(self, self.resume) if self.resume else None  # before the workers take the clock
        torch.manual_seed(cfg.seed)
        learner_core, _ = core_plan(len(booted.cmd_qs), cfg.rollout.pin_cores)
        if learner_core is not None:
            pin_to_core(learner_core)
        torch.set_num_threads(1)
        self.policy_dir = resolve_model_dir(cfg.model.policy, cfg.model.cache_dir, cfg.seed)
        teacher_dir = (resolve_model_dir(cfg.model.teacher, cfg.model.cache_dir, cfg.seed)
                       if cfg.algorithm.objective == "opd" else None)
        dtype, device = getattr(torch, cfg.model.dtype), torch.device(cfg.model.device)
        self.model = with_lora(load_model(self.policy_dir, dtype).to(device), cfg.model.lora).train()
        self.tokenizer = load_tokenizer(self.policy_dir)
        ref = None
        if cfg.algorithm.kl_coef > 0:
            ref = load_model(self.policy_dir, dtype).to(device)
            ref.requires_grad_(False)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
        load_state = weights_loader(self.resume)
        version = load_state(self.model, self.optimizer) if load_state else 0
        on_policy = cfg.train.schedule in ("sync", "streaming")
        self.learner = (StreamingLearner if on_policy else OffPolicyLearner)(self.model, cfg.algorithm, ref)
        self.env = make_env(cfg.task)
        self.evaluator = (Evaluator(cfg, self.env, self.model, self.tokenizer, turn_stop_ids(self.tokenizer, self.policy_dir))
                          if cfg.train.eval_every else None)
        self.store = WeightStore(publish_view(self.model), counters=booted.counters)
        if version:
            self.store.publish(publish_view(self.model), version)  # the workers start from the resumed version
        self.fleet = Fleet(cfg, str(self.policy_dir), str(teacher_dir) if teacher_dir else None,
                           self.store, self.origin, booted)
        gc.freeze()  # as in the workers: full collections skip torch's and the model's objects
        self.first_step = 0
        if resumed is not None:
            resumed.restore_rng()  # after the models were built (that seeded torch)
            self.first_step = resumed.steps_done
        self.checkpoints = Checkpointer(self)
        self.sink.emit({"type": "run", "status": "started", "t": self.now(), "config": cfg.model_dump(),
                        "policy_dir": str(self.policy_dir), "workers": len(booted.cmd_qs)})

    # -- rollout side --------------------------------------------------------------
    def new_groups(self, n: int, step: int) -> list[int]:
        """Dispatch ``n`` groups of ``group_size`` trajectories on one prompt each."""
        G, items, groups = self.cfg.train.group_size, [], []
        for _ in range(n):
            g = self.next_group
            self.next_group += 1
            task = task_for_group(self.env, g, self.cfg.seed)
            for _ in range(G):
                items.append((self.next_traj, g, task, self.cfg.seed * 10_000_019 + self.next_traj))
                self.next_traj += 1
            groups.append(g)
        if step >= 0:
            self.dispatch_versions[step] = self.version
        self.fleet.dispatch(step, items)
        return groups

    def receive(self, timeout: float | None = None):
        """Next trajectory or scored turn from the fleet; spans are emitted on the way."""
        if self.pending:
            return self.pending.popleft()
        while True:
            msg = self.fleet.poll()
            if msg is None:  # about to wait: the sink writes its queued events meanwhile
                self.sink.idle(self.fleet.has_message)
                t0 = self.now()
                msg = self.fleet.get(timeout)
                self.waits.append((t0, self.now()))
            item = self._take(msg)
            if item is not None:
                return item

    @staticmethod
    def _carried_spans(msg) -> list[dict]:
        """The spans a fleet message carries: a batch, or those sent along with a trajectory/turn."""
        if msg[0] == "spans":
            return msg[1]
        return msg[2] if msg[0] in ("traj", "turn") and len(msg) > 2 else []

    def _take(self, msg):
        if msg[0] not in ("spans", "traj", "turn"):
            raise RuntimeError(f"unexpected rollout message {msg[0]!r} from replica {msg[1]}")
        for s in self._carried_spans(msg):
            self.emit_span(s)
        return None if msg[0] == "spans" else msg[1]

    def drain_spans(self) -> None:
        """Emit every span the fleet has already sent (async rollouts run beside the learner:
        their spans belong in this step's metrics); keep trajectories for later."""
        while (msg := self.fleet.poll()) is not None:
            item = self._take(msg)
            if item is not None:
                self.pending.append(item)

    # -- learner side --------------------------------------------------------------
    def learn(self, item: Trajectory | ScoredTurn) -> None:
        if isinstance(item, ScoredTurn):
            self.learner.on_turn(item, on_phase=self.on_phase)
        else:
            self.learner.on_trajectory(item, on_phase=self.on_phase)

    def optimizer_step(self, wait_for_replicas: bool) -> None:
        """Barrier: (dump), clip the final gradient, one optimizer step, publish."""
        rec = self.rec
        t0 = self.now()  # the barrier's checks are learner work: inside the optimizer span
        # before the weights move: sampled versions as expected, engine vs learner log-probs
        check_sampled_versions(rec.trajs, self.dispatch_versions)
        rec.mismatch = step_mismatch(self.model, rec.trajs, self.version, known=self.learner.logprobs.take())
        if self.dump_dir and rec.step == 0:
            from learner.audit import write_dump

            grads = {n: p.grad.detach().float().clone() for n, p in self.model.named_parameters() if p.grad is not None}
            write_dump(self.dump_dir, self.model, self.tokenizer, rec.trajs, self.cfg.algorithm, grads)
            t0 = self.now()  # the audit dump is not training work
        clip = self.cfg.train.grad_clip
        norm = torch.nn.utils.clip_grad_norm_(self.params, clip if clip > 0 else float("inf"))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.learner_span("learner.optimizer", t0, self.now())
        rec.learner_stats["grad_norm"] = float(norm)
        rec.trained_version = self.version
        self.version += 1
        t0 = self.now()
        self.store.publish(publish_view(self.model), self.version)
        if wait_for_replicas:
            self.ensure_fleet_version()
        self.learner_span("learner.publish", t0, self.now())

    def ensure_fleet_version(self) -> None:
        """Every replica loads the current version and acknowledges it (one span each)."""
        for w, t0, t1 in self.fleet.load_all(self.version, on_other=self._unexpected):
            self.emit_span(Span(step=self.rec.step, kind="learner.publish", t0=t0, t1=t1, lane=f"replica/{w}",
                                policy_version=self.version))

    def settle_fleet(self) -> None:
        """End of an off-policy run (publishes there do not wait): every replica loads the
        final version and acknowledges it, so each publish reaches each replica and shows as
        its span; rollouts still in flight are discarded, no step would train them."""
        def late(msg) -> None:
            for s in self._carried_spans(msg):
                self.emit_span(s)

        for w, t0, t1 in self.fleet.load_all(self.version, on_other=late):
            self.emit_span(Span(step=self.rec.step, kind="learner.publish", t0=t0, t1=t1, lane=f"replica/{w}",
                                policy_version=self.version))

    def _unexpected(self, msg) -> None:
        if msg[0] == "spans":
            for s in msg[1]:
                self.emit_span(s)
        else:
            raise RuntimeError(f"rollout message {msg[0]} while replicas load weights")

    # -- metrics -------------------------------------------------------------------
    def finish_step(self, t_end: float | None = None) -> dict:
        """Metrics of the step that ended at ``t_end`` (its publish; default now). The next
        step starts there too (``self.t_step_end``), so steps tile the run: bookkeeping
        after a publish belongs to the next step, never to no step."""
        rec = self.rec
        t_end = self.now() if t_end is None else t_end
        self.t_step_end = t_end
        self.drain_spans()
        window = [s for s in self.recent if s["t1"] > rec.t_start]
        values = window_metrics(window, rec.t_start, t_end)
        # verl's fully-async trainer/idle_ratio: the share of the step spent blocked waiting
        # for rollout data (ours above is stricter: no learner span running, so the learner's
        # own bookkeeping between spans counts as idle too)
        values["trainer/wait_ratio"] = union_length(self.waits, rec.t_start, t_end) / max(t_end - rec.t_start, 1e-12)
        self.waits = [w for w in self.waits if w[1] > t_end]
        staleness = [rec.trained_version - v for t in rec.trajs for v in t.turn_versions]
        rewards = [t.reward for t in rec.trajs]
        last_reward = max(t.t_reward for t in rec.trajs)
        learner_busy = 1.0 - values["trainer/idle_ratio"]
        gen_busy = 1.0 - values["rollouter/idle_ratio"]
        values.update({
            "timing_s/step": t_end - rec.t_start,
            "timing_s/learner": learner_busy * (t_end - rec.t_start),
            "timing_s/gen": gen_busy * (t_end - rec.t_start),
            "timing_s/tail": t_end - last_reward,
            "step/t_start": rec.t_start,
            "step/t_end": t_end,
            "step/last_reward_t": last_reward,
            "step/first_backward_t": rec.first_backward if rec.first_backward is not None else float("nan"),
            "staleness/mean": sum(staleness) / max(len(staleness), 1),
            "staleness/max": float(max(staleness, default=0)),
            "reward/mean": sum(rewards) / len(rewards),
            "response/turns_mean": sum(len(t.turn_versions) for t in rec.trajs) / len(rec.trajs),
            "response/tokens": float(sum(t.n_scored for t in rec.trajs)),
            "actor/grad_norm": rec.learner_stats.get("grad_norm", 0.0),
            "memory/peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
            "policy/version": float(self.version),
            **rec.mismatch,
            **task_metrics(rec.trajs),
        })
        if self.cfg.train.schedule == "fully-async":
            values["rollout/dropped_groups"] = float(rec.dropped_groups)
        for k in ("clip_frac", "peak_buffers"):
            if k in rec.learner_stats:
                values[f"actor/{k}"] = float(rec.learner_stats[k])
        if self.evaluator is not None and self.evaluator.due(rec.step):  # the policy just published
            values.update(self.evaluator.run(rec.step))
        if "peak_buffers" in rec.learner_stats:  # the accumulators' memory: adapter-sized under LoRA
            values["memory/grad_buffers_mb"] = grad_buffer_mb(self.params, rec.learner_stats["peak_buffers"])
        self.sink.emit(StepMetrics(rec.step, values))
        self.recent = [s for s in self.recent if s["t1"] > t_end]
        self.rewards.append(values["reward/mean"])
        if self.on_step:
            self.on_step({"step": rec.step, **values})
        return values

    # -- schedules -----------------------------------------------------------------
    def run_on_policy(self, streaming: bool) -> None:
        """sync and streaming: identical except *when* each trajectory's backward runs."""
        P, G, steps = self.cfg.train.prompts_per_step, self.cfg.train.group_size, self.cfg.train.steps
        opd = self.cfg.algorithm.objective == "opd"
        self.t_step_end = self.now()
        groups = self.new_groups(P, self.first_step)
        for step in range(self.first_step, steps):
            self.rec = StepRecord(step, self.t_step_end)
            self.learner.begin_batch({g: G for g in groups})
            held: list = []
            while len(self.rec.trajs) < P * G:
                item = self.receive()
                if streaming and not self.pending:
                    # take every message already waiting in one go, so the backward passes
                    # that follow run back to back instead of each after a pipe read
                    self.drain_spans()
                if isinstance(item, Trajectory):
                    self.rec.trajs.append(item)
                if opd and isinstance(item, Trajectory):
                    held.append(item)  # closes the trajectory's turn accounting
                elif streaming:
                    self.learn(item)
                else:
                    held.append(item)
            if not streaming:
                # sync: the learner starts only after the last reward of the batch
                for item in sorted(held, key=learn_order):
                    self.learn(item)
            else:
                for item in held:
                    self.learn(item)
            self.rec.learner_stats = self.learner.finish_batch()
            self.optimizer_step(wait_for_replicas=True)
            published = self.now()
            if step + 1 < steps:  # the next batch's first turn generates while this step's metrics are made
                groups = self.new_groups(P, step + 1)
            self.finish_step(t_end=published)
            self.checkpoints.at_boundary(step + 1)

    def train_off_policy(self) -> None:
        self.rec.learner_stats = self.learner.train_batch(self.rec.trajs, on_phase=self.on_phase)
        self.optimizer_step(wait_for_replicas=False)
        self.finish_step()
        self.checkpoints.at_boundary(self.rec.step + 1)

    def run_async(self) -> None:
        """One-step off-policy: batch s+1 rolls out with weights s while batch s trains."""
        P, G, steps = self.cfg.train.prompts_per_step, self.cfg.train.group_size, self.cfg.train.steps
        self.t_step_end = self.now()
        self.new_groups(P, self.first_step)
        for step in range(self.first_step, steps):
            self.rec = StepRecord(step, self.t_step_end)
            while len(self.rec.trajs) < P * G:
                item = self.receive()
                if isinstance(item, Trajectory):
                    self.rec.trajs.append(item)
            if step + 1 < steps:
                self.ensure_fleet_version()  # replicas are idle now: they take the newest weights
                self.new_groups(P, step + 1)
            self.train_off_policy()

    def run_fully_async(self) -> None:
        """No batch barrier for rollout: keep the fleet fed within the staleness bound."""
        P, G, steps = self.cfg.train.prompts_per_step, self.cfg.train.group_size, self.cfg.train.steps
        bound = self.cfg.train.max_staleness
        members: dict[int, list[Trajectory]] = {}
        complete: list[int] = []
        dispatched, dropped = self.first_step * P, 0  # a resumed run has nothing in flight
        self.t_step_end = self.now()

        def fresh(groups: list[int]) -> list[int]:
            """Those of ``groups`` still within the bound at this version; the rest are measured
            and dropped, never trained."""
            nonlocal dropped
            keep = [g for g in groups if self.version - min(t.min_version() for t in members[g]) <= bound]
            for g in set(groups) - set(keep):
                del members[g]
                dropped += 1
                self.rec.dropped_groups += 1
            return keep

        for step in range(self.first_step, steps):
            self.rec = StepRecord(step, self.t_step_end)
            # a group completed during the last step but not taken is trained one version later
            complete = fresh(complete)
            while len(complete) < P:
                # a group dispatched now is trained at version >= its rank // P, its rank among
                # the groups not dropped (a dropped group frees its place: otherwise drops would
                # shrink the pipeline for good and, past bound * P of them, stall the run)
                while dispatched - dropped < min((self.version + bound + 1) * P, steps * P):
                    self.new_groups(1, -1)
                    dispatched += 1
                item = self.receive()
                if not isinstance(item, Trajectory):
                    continue
                members.setdefault(item.group, []).append(item)
                if len(members[item.group]) == G:
                    complete += fresh([item.group])
            batch, complete = complete[:P], complete[P:]  # the first P groups to complete
            for g in batch:
                for t in members.pop(g):
                    t.step = step
                    self.rec.trajs.append(t)
            self.train_off_policy()

    def run(self) -> dict:
        schedule = self.cfg.train.schedule
        try:
            if schedule in ("sync", "streaming"):
                self.run_on_policy(streaming=schedule == "streaming")
            elif schedule == "async":
                self.run_async()
                self.settle_fleet()
            else:
                self.run_fully_async()
                self.settle_fleet()
        except stopping.Interrupted:
            self.checkpoints.on_stop(self.rec.step if hasattr(self, "rec") else self.first_step)  # the boundary before
            raise
        finally:
            self.fleet.close()
        if self.cfg.train.output_dir:
            save_final_model(lambda tmp: save_policy(self.model, self.tokenizer, tmp), self.cfg.train.output_dir)
        summary = {"steps": self.cfg.train.steps, "schedule": schedule, "reward_curve": self.rewards,
                   "final_version": self.version, "spans": self.seq, "wall_s": self.now()}
        self.sink.emit({"type": "run", "status": "finished", "summary": summary, "t": self.now()})
        return summary


def learn_order(item: Trajectory | ScoredTurn) -> tuple:
    """What a step learns at its barrier, in an order that does not depend on arrival
    (turns before trajectories, then by trajectory and turn): float sums in a fixed order
    make a sync run, and one resumed from a checkpoint, reproducible bit for bit."""
    if isinstance(item, ScoredTurn):
        return (0, item.traj, item.turn)
    return (1, item.id, 0)


def train(cfg: RunConfig, sink: EventSink, dump_dir: str | Path | None = None,
          on_step: Callable[[dict], None] | None = None, booted: BootedWorkers | None = None,
          resume: ResumePoint | None = None) -> tuple[Trainer, dict]:
    """Run ``cfg`` to completion; returns the trainer (model, optimizer) and a summary.
    ``booted``: the run's rollout workers, from ``boot_fleet(cfg)`` (spawned here when None);
    ``resume``: continue from a checkpoint (learner/driver/resume.py)."""
    trainer = Trainer(cfg, sink, str(dump_dir) if dump_dir else None, on_step, resume)
    booted = booted or boot_fleet(cfg)
    try:
        trainer.setup(booted)
    finally:
        booted.close()  # only if setup failed before its fleet took the workers over
    try:
        return trainer, trainer.run()
    finally:
        gc.unfreeze()
