"""The barrier that ends every step: checks, (audit dump), gradient clipping, one optimizer
step, publish (docs/math.md, "Barrier")."""

from __future__ import annotations

import torch

from learner.config import RunConfig
from learner.driver.metrics import StepRecord
from learner.driver.recorder import Recorder
from learner.driver.rollouts import Rollouts
from learner.driver.setup import RunParts
from learner.mismatch import check_sampled_versions, step_mismatch


def barrier(parts: RunParts, rec: StepRecord, version: int, recorder: Recorder, rollouts: Rollouts,
            cfg: RunConfig, dump_dir: str | None, wait_for_replicas: bool) -> int:
    """Step ``rec`` (trained at ``version``) through the barrier; returns the new version.
    ``wait_for_replicas``: the publish ends once every replica loaded the new weights."""
    model = parts.model
    t0 = recorder.now()  # the barrier's checks are learner work: inside the optimizer span
    # before the weights move: sampled versions as expected, engine vs learner log-probs
    check_sampled_versions(rec.trajs, rollouts.dispatch_versions)
    rec.mismatch = step_mismatch(model, rec.trajs, version, known=parts.learner.logprobs.take())
    if dump_dir and rec.step == 0:
        from learner.audit import write_dump

        grads = {n: p.grad.detach().float().clone() for n, p in model.named_parameters() if p.grad is not None}
        write_dump(dump_dir, model, parts.tokenizer, rec.trajs, cfg.algorithm, grads)
        t0 = recorder.now()  # the audit dump is not training work
    clip = cfg.train.grad_clip
    norm = torch.nn.utils.clip_grad_norm_(parts.params, clip if clip > 0 else float("inf"))
    parts.optimizer.step()
    parts.optimizer.zero_grad(set_to_none=True)
    recorder.learner_span("learner.optimizer", t0, recorder.now(), version)
    rec.learner_stats["grad_norm"] = float(norm)
    rec.trained_version = version
    version += 1
    t0 = recorder.now()
    parts.store.publish(dict(model.named_parameters()), version)
    if wait_for_replicas:
        rollouts.ensure_version(version)
    recorder.learner_span("learner.publish", t0, recorder.now(), version)
    return version
