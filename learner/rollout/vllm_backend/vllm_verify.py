"""Verification of drafts on the vLLM engine (docs/speculation-verify.md, "On vLLM"): one vLLM prefill of
each draft under the new weights with full-vocabulary prompt log-probs, the keyed sample redrawn
at every sampled position from them, and the draft kept up to the first position that differs
(the same verdicts as ``rollout/speculation/token_verify.py``'s torch forward, ``_verdicts``).

The verifying computation is vLLM's own forward, the engine the remainder and every direct turn
sample with, so a kept token is what vLLM's kernels draw there; the remaining difference is a
prefill's logits against a decode step's (and log softmax's shift), measured in
docs/speculation-verify.md.
"""

from __future__ import annotations

import torch

from learner.rollout.speculation.token_verify import Sampled, Verdict, _verdicts


def verify_on_vllm(engine, drafts: list[Sampled], temperature: float, top_p: float) -> list[Verdict]:
    """The verdict of each draft under the weights ``engine`` (a ``VllmEngine``) holds now."""
    if not drafts:
        return []
    rows = engine.prompt_logprobs([d.ids for d in drafts])  # row j - 1: position j's distribution
    at = torch.cat([r[[j - 1 for j in d.positions]] for r, d in zip(rows, drafts)])
    return _verdicts(drafts, at, temperature, top_p)
