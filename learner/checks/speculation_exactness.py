"""Randomised check that keyed verification (learner/rollout/speculation/token_verify.py) reproduces direct
sampling token for token (docs/speculation.md), a case of ``thundersync check-exactness``.

Per case: a random tiny Llama θ_k and θ_{k+1} = θ_k moved by a random relative step; rows of
random prompts (``GROUP`` rows each, so verification shares their prefix) are drafted under θ_k
with the keyed sampler, verified against θ_{k+1}, and continued from the first differing
position with the same streams, each rejected row from the keys/values verification kept for it
(``rollout/engine/kv_keep.py``); the result must equal what θ_{k+1} samples directly from the same
prompts and seeds, in every token.
"""

from __future__ import annotations

import random

import torch

from learner.checks.tiny_models import VOCAB, tiny_llama
from learner.rollout.engine.torch_engine import TorchEngine
from learner.rollout.engine.kv_keep import KeepKV
from learner.rollout.engine.sampling import SamplingParams, Stream
from learner.rollout.speculation.token_verify import Sampled, verify

ROWS, NEW_TOKENS, GROUP = 8, 24, 2  # GROUP rows share a prompt, as a GRPO group's drafts do
SETTINGS = ((1.0, 1.0, 0.02), (1.0, 1.0, 0.2), (0.8, 0.9, 0.05), (1.3, 1.0, 0.5))  # (T, top-p, drift)


def drifted(model: torch.nn.Module, drift: float, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {n: p.detach() * (1 + drift * torch.randn(p.shape, generator=gen)) for n, p in model.named_parameters()}


def run_case(seed: int, temperature: float, top_p: float, drift: float) -> dict:
    rng = random.Random(seed)
    model = tiny_llama(torch.float32, seed)
    engine = TorchEngine(model, pad_id=0, reuse_kv=True)
    engine.prefixes.min_tokens = 1  # short contexts: every rejected row continues from verification's keys/values
    params = SamplingParams(NEW_TOKENS, [], temperature, top_p)
    distinct = [[rng.randrange(1, VOCAB) for _ in range(rng.randint(2, 9))] for _ in range(ROWS // GROUP)]
    prompts = [p for p in distinct for _ in range(GROUP)]
    seeds = [rng.randrange(2**40) for _ in range(ROWS)]
    drafts = engine.generate(prompts, params, seeds=seeds)
    engine.load_weights(drifted(model, drift, seed + 1), version=1)
    direct = engine.generate(prompts, params, seeds=seeds)
    views = [Sampled(p + d.token_ids, list(range(len(p), len(p) + NEW_TOKENS)),
                     [Stream(s, n) for n in range(NEW_TOKENS)]) for p, d, s in zip(prompts, drafts, seeds)]
    verdicts = verify(model, views, temperature, top_p, pad_id=0, keep=KeepKV(engine.prefixes, list(range(ROWS)), 10**9))
    equal, kept, expect, reused = 0, 0, 0, engine.prefixes.tokens_reused
    for b, (p, d, s, v, ref) in enumerate(zip(prompts, drafts, seeds, verdicts, direct)):
        tokens = d.token_ids[:v.kept] + ([] if v.token is None else [v.token])
        if len(tokens) < NEW_TOKENS:  # (a rejected row continues from its kept keys/values: counted below)
            tokens += engine.generate([p + tokens], params, seeds=[Stream(s, len(tokens))], keys=[b])[0].token_ids
            expect += v.kv_tokens
        equal += tokens == ref.token_ids
        kept += v.kept
    reused = engine.prefixes.tokens_reused - reused
    every_rejected = all(v.kv_tokens > 0 for v in verdicts if v.token is not None)
    return {"seed": seed, "temperature": temperature, "top_p": top_p, "drift": drift, "rows": ROWS,
            "kept_token_share": kept / (ROWS * NEW_TOKENS), "rows_equal": equal, "kv_reused_tokens": reused,
            "passed": equal == ROWS and reused == expect and every_rejected}


def speculation_cases(seed: int = 0) -> list[dict]:
    return [run_case(seed * 100 + k, *setting) for k, setting in enumerate(SETTINGS)]


def print_cases(cases: list[dict]) -> None:
    print(f"{'speculation':11} {'T':>4} {'top_p':>5} {'drift':>5} {'kept':>6} {'rows equal':>10} {'kv reused':>9}  ok")
    for c in cases:
        print(f"{'verify':11} {c['temperature']:4.1f} {c['top_p']:5.2f} {c['drift']:5.2f} "
              f"{c['kept_token_share']:6.1%} {c['rows_equal']:>5}/{c['rows']:<4} {c['kv_reused_tokens']:>9}  "
              f"{'yes' if c['passed'] else 'NO'}")
