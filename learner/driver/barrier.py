"""The barrier that ends every step: checks, (audit dump), the learner's own clip and optimizer
step, publish (docs/math.md, "Barrier")."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from learner.audit import write_dump
from learner.config import RunConfig
from learner.driver import rules
from learner.driver.metrics import StepRecord
from learner.driver.recorder import Recorder
from learner.driver.rollouts import Rollouts
from learner.driver.setup import RunParts
from learner.grad.mismatch import check_sampled_versions, step_mismatch
from learner.rollout.engine.factory import engine_dtype
from learner.timeline import Kind


@dataclass(frozen=True)
class AuditDump:
    """``--dump-step DIR --dump-at STEP``: step ``step`` of run ``cfg`` dumped to ``dir`` for
    ``thundersync audit`` (learner/audit.py)."""

    dir: str
    step: int
    cfg: RunConfig

    def write(self, parts: RunParts, rec: StepRecord) -> None:
        """The step's pre-step model, batch (with how it was sampled) and final gradient, in the
        model's dtype."""
        cfg, version = self.cfg, rec.trained_version
        how = {"schedule": cfg.train.schedule, "step": rec.step, "trained_version": version,
               "group_size": cfg.train.group_size, "off_policy": rules.off_policy(cfg.train.schedule),
               "sampling": {"temperature": cfg.rollout.temperature, "top_p": cfg.rollout.top_p}}
        # the KL reference is the initial policy: model/ holds it only at step 0
        ref = parts.learner.ref_model if version > 0 else None
        write_dump(self.dir, parts.model, parts.tokenizer, rec.trajs, cfg.algorithm, parts.learner.batch_gradient(),
                   ref_model=ref, step=how)


class Barrier:
    """The end of every step, for the run of ``parts``: its spans go to ``recorder``, its
    publishes to the replicas of ``rollouts``."""

    def __init__(self, parts: RunParts, recorder: Recorder, rollouts: Rollouts, audit: AuditDump | None):
        self.parts, self.recorder, self.rollouts, self.audit = parts, recorder, rollouts, audit
        self.engine_dtype = getattr(torch, engine_dtype(rollouts.cfg))  # rollout.dtype, else model.dtype

    def __call__(self, rec: StepRecord, version: int, wait_for_replicas: bool) -> int:
        """Step ``rec`` (trained at ``version``) through the barrier; returns the new version.
        ``wait_for_replicas``: the publish ends once every replica loaded the new weights."""
        parts, recorder = self.parts, self.recorder
        rec.trained_version = version
        t0 = recorder.now()  # the barrier's checks are learner work: inside the optimizer span
        # before the weights move: sampled versions as expected, engine vs learner log-probs
        check_sampled_versions(rec.trajs, self.rollouts.dispatch_versions)
        rec.mismatch = step_mismatch(parts.model, rec.trajs, version, known=parts.learner.logprobs.take(),
                                     engine_dtype=self.engine_dtype)
        if self.audit is not None and rec.step == self.audit.step:
            self.audit.write(parts, rec)
            t0 = recorder.now()  # the audit dump is not training work
        norm = parts.learner.step()
        recorder.learner_span(Kind.OPTIMIZER, t0, recorder.now(), version)
        rec.learner_stats["grad_norm"] = float(norm)
        version += 1
        t0 = recorder.now()
        parts.publish(version)
        if wait_for_replicas:
            self.rollouts.ensure_version(version)
        recorder.learner_span(Kind.PUBLISH, t0, recorder.now(), version)
        return version
