"""Keyed speculation on vLLM (docs/speculation-verify.md, "On vLLM"): how often a token flips between
kernels, and what each way of verifying costs.

    .venv/bin/python -m bench.decisions.vllm_verify [--rows 64] [--tokens 64] [--batches 8] [--repeats 5]

1. Flips, same weights: vLLM samples ``--batches`` x ``--rows`` rows of ``--tokens`` tokens each
   (keyed, rollout/vllm_backend/vllm_keyed.py; no stop token, so every row has them all); at every sampled
   position the keyed sample is drawn again from (a) vLLM's prefill (full-vocabulary prompt
   log-probs, the verifier rollout/vllm_backend/vllm_verify.py uses) and (b) the torch model's forward on the
   same weights (speculation.py's path); a position where it differs from vLLM's decoded token is
   a flip. Printed per million tokens, with the largest log-prob difference between the kernels
   (torch vs vLLM prefill over the vocabulary; vLLM prefill vs vLLM's decode steps at the sampled
   tokens, all those steps report) and how many positions had their two best perturbed scores
   closer than it (the near-ties a kernel difference of that size could flip).
2. Cost: the first batch verified against the policy moved by a small random step, by vLLM's
   prefill and by the torch forward (shared prefix), arms alternated, medians; their verdicts compared.

One torch thread; the machine is shared, so timings move with its load.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from learner.config import RunConfig
from learner.models.loading import load_model, load_tokenizer, resolve_model_dir
from learner.rollout.engine.sampling import SamplingParams, Stream, keyed_sample, race_noise, row_keys
from learner.rollout.speculation.token_verify import Sampled, verify
from learner.rollout.vllm_backend.vllm_verify import verify_on_vllm

PROMPTS = ["Q: 3+4*2=? A:", "Q: 12-5=? A:", "Q: (7+8)*3=? A:", "Q: 19*2-4=? A:"]


def sample(eng, tok, rows: int, tokens: int, batch: int) -> list[Sampled]:
    prompts = [tok.encode(PROMPTS[b % len(PROMPTS)], add_special_tokens=False) for b in range(rows)]
    seeds = [10_000 * batch + b for b in range(rows)]
    outs = eng.generate(prompts, SamplingParams(tokens, [], 1.0, 1.0), seeds=seeds)
    views = [Sampled(p + o.token_ids, list(range(len(p), len(p) + tokens)), [Stream(s, i) for i in range(tokens)])
             for p, o, s in zip(prompts, outs, seeds)]
    return views, torch.tensor([lp for o in outs for lp in o.logprobs])  # decode steps' raw log-probs


def keyed(at: torch.Tensor, views: list[Sampled]) -> torch.Tensor:
    streams = [s for v in views for s in v.streams]
    return keyed_sample(at, 1.0, 1.0, row_keys(streams, [0] * len(streams), at.device))


def near_ties(at: torch.Tensor, views: list[Sampled], margin: float) -> int:
    """Positions whose two best perturbed scores are closer than ``margin``."""
    streams = [s for v in views for s in v.streams]
    scores = at.double() + race_noise(row_keys(streams, [0] * len(streams), at.device), at.shape[-1])
    top = scores.topk(2, dim=-1).values
    return int((top[:, 0] - top[:, 1] < margin).sum())


def flips(eng, model, views: list[Sampled], decoded: torch.Tensor) -> dict:
    drafted = torch.tensor([v.ids[j] for v in views for j in v.positions])
    rows = eng.prompt_logprobs([v.ids for v in views])
    vllm_at = torch.cat([r[[j - 1 for j in v.positions]] for r, v in zip(rows, views)])
    with torch.no_grad():  # one forward per row: no padding in the torch logits either
        logits = torch.cat([model(input_ids=torch.tensor([v.ids])).logits[0, [j - 1 for j in v.positions]].float()
                            for v in views])
    torch_at = torch.log_softmax(logits, -1)
    delta = float((torch_at - vllm_at).abs().max())
    # vLLM's prefill against its own decode steps: only the sampled token's log-prob comes back from those
    own = float((vllm_at.gather(-1, drafted[:, None]).squeeze(-1) - decoded).abs().max())
    return {"tokens": len(drafted), "own_delta": own, "own_near_ties": near_ties(vllm_at, views, own), "vllm_prefill": int((keyed(vllm_at, views) != drafted).sum()),
            "torch": int((keyed(torch_at, views) != drafted).sum()), "max_delta": delta,
            "near_ties": near_ties(torch_at, views, delta)}


def cost(eng, model, views: list[Sampled], repeats: int, pad_id: int) -> dict:
    moved = load_model(resolve_model_dir("builtin:tiny"))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p_moved, p in zip(moved.parameters(), model.parameters()):
            p_moved.copy_(p + 0.003 * torch.randn(p.shape, generator=gen))
    eng.load_weights(dict(moved.named_parameters()), 1)
    times: dict[str, list[float]] = {"vllm": [], "torch": []}
    verdicts = {}
    for _ in range(repeats):
        for arm in times:
            t0 = time.perf_counter()
            verdicts[arm] = (verify_on_vllm(eng, views, 1.0, 1.0) if arm == "vllm"
                             else verify(moved, views, 1.0, 1.0, pad_id))
            times[arm].append(time.perf_counter() - t0)
    same = [(a.kept, a.token) for a in verdicts["vllm"]] == [(b.kept, b.token) for b in verdicts["torch"]]
    kept = sum(v.kept for v in verdicts["vllm"]) / sum(len(v.positions) for v in views)
    return {arm: statistics.median(t) for arm, t in times.items()} | {"same_verdicts": same, "kept_share": kept}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--batches", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    from learner.rollout.vllm_backend.vllm_engine import VllmEngine

    policy_dir = resolve_model_dir("builtin:tiny")
    tok, model = load_tokenizer(policy_dir), load_model(policy_dir)
    eng = VllmEngine(RunConfig(), str(policy_dir), tok, replica=0)
    try:
        total = {"tokens": 0, "vllm_prefill": 0, "torch": 0, "max_delta": 0.0, "near_ties": 0, "own_delta": 0.0,
                 "own_near_ties": 0}
        first = None
        for batch in range(args.batches):
            views, decoded = sample(eng, tok, args.rows, args.tokens, batch)
            first = first or views
            got = flips(eng, model, views, decoded)
            total = {k: max(v, got[k]) if k.endswith("delta") else v + got[k] for k, v in total.items()}
        per_m = 1e6 / total["tokens"]
        print(f"flips, same weights, {total['tokens']} tokens: vLLM prefill {total['vllm_prefill']} "
              f"({total['vllm_prefill'] * per_m:.1f} per million), torch forward {total['torch']} "
              f"({total['torch'] * per_m:.1f} per million); max |logit difference| torch vs vLLM "
              f"{total['max_delta']:.2e}, positions with a closer near-tie {total['near_ties']}; max |log-prob "
              f"difference| vLLM prefill vs its decode steps (sampled tokens) {total['own_delta']:.2e}, positions "
              f"with a closer near-tie {total['own_near_ties']}")
        c = cost(eng, model, first, args.repeats, tok.pad_token_id)
        print(f"verify {len(first)} drafts x {args.tokens} tokens (kept share {c['kept_share']:.3f}): vLLM prefill "
              f"{c['vllm']:.3f} s, torch forward {c['torch']:.3f} s; same verdicts: {c['same_verdicts']}")
    finally:
        eng.close()


if __name__ == "__main__":
    main()
