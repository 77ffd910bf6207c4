"""The barrier that ends every step: checks, (audit dump), gradient clipping, one optimizer
step, publish (docs/math.md, "Barrier")."""

from __future__ import annotations

import torch

from learner.config import RunConfig
from learner.driver import rules
from learner.driver.metrics import StepRecord
from learner.driver.recorder import Recorder
from learner.driver.rollouts import Rollouts
from learner.distributed.front import DataParallelLearner
from learner.driver.setup import RunParts
from learner.grad.mismatch import check_sampled_versions, step_mismatch
from learner.timeline import Kind


def barrier(parts: RunParts, rec: StepRecord, version: int, recorder: Recorder, rollouts: Rollouts,
            cfg: RunConfig, dump: tuple[str, int] | None, wait_for_replicas: bool) -> int:
    """Step ``rec`` (trained at ``version``) through the barrier; returns the new version.
    ``dump``: (directory, step) of the audit dump; ``wait_for_replicas``: the publish ends
    once every replica loaded the new weights."""
    model = parts.model
    t0 = recorder.now()  # the barrier's checks are learner work: inside the optimizer span
    # before the weights move: sampled versions as expected, engine vs learner log-probs
    check_sampled_versions(rec.trajs, rollouts.dispatch_versions)
    rec.mismatch = step_mismatch(model, rec.trajs, version, known=parts.learner.logprobs.take())
    ranks = isinstance(parts.learner, DataParallelLearner)
    if ranks:
        parts.learner.reduce()  # the batch gradient: every rank's share, summed
    if dump and rec.step == dump[1]:
        write_audit_dump(dump[0], parts, rec, version, cfg)
        t0 = recorder.now()  # the audit dump is not training work
    if ranks:  # the engine clips the reduced gradient and steps; every rank the same
        norm = parts.learner.step()
    else:
        clip = cfg.train.grad_clip
        norm = torch.nn.utils.clip_grad_norm_(parts.params, clip if clip > 0 else float("inf"))
        parts.optimizer.step()
        parts.optimizer.zero_grad(set_to_none=True)
    recorder.learner_span(Kind.OPTIMIZER, t0, recorder.now(), version)
    rec.learner_stats["grad_norm"] = float(norm)
    rec.trained_version = version
    version += 1
    t0 = recorder.now()
    parts.publish(version)
    if wait_for_replicas:
        rollouts.ensure_version(version)
    recorder.learner_span(Kind.PUBLISH, t0, recorder.now(), version)
    return version


def write_audit_dump(dir: str, parts: RunParts, rec: StepRecord, version: int, cfg: RunConfig) -> None:
    """The step's pre-step model, batch (with how it was sampled) and final gradient, in the
    model's dtype, for ``thundersync audit`` (learner/audit.py)."""
    from learner.audit import write_dump

    model = parts.model
    if isinstance(parts.learner, DataParallelLearner):
        names = [n for n, p in model.named_parameters() if p.requires_grad]
        grads = dict(zip(names, parts.learner.reduced_grads()))
    else:
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    how = {"schedule": cfg.train.schedule, "step": rec.step, "trained_version": version,
           "group_size": cfg.train.group_size, "off_policy": rules.off_policy(cfg.train.schedule),
           "sampling": {"temperature": cfg.rollout.temperature, "top_p": cfg.rollout.top_p}}
    # the KL reference is the initial policy: model/ holds it only at step 0
    ref = parts.learner.ref_model if version > 0 else None
    write_dump(dir, model, parts.tokenizer, rec.trajs, cfg.algorithm, grads, ref_model=ref, step=how)
