"""The barrier's log-prob recompute is chunked over tokens and vocabulary
(``learner.grad.mismatch.learner_logprobs``): the same figures as one full-vocabulary forward,
and memory bounded by the chunks, not by B × T × V."""

import json
import random
import subprocess
import sys

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from learner.grad.mismatch import learner_logprobs, step_mismatch
from learner.grad.objectives import token_logprobs
from learner.checks.tiny_models import tiny_lora_llama
from learner.models.loading import widen_norms
from learner.trajectory import Trajectory


def _llama(vocab: int, dtype: torch.dtype, seed: int = 0, layers: int = 2) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=layers,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                         attn_implementation="sdpa", initializer_range=0.1)
    return widen_norms(LlamaForCausalLM(config).to(dtype).eval())


def _trajs(vocab: int, n: int, seed: int = 0, lo: int = 3, hi: int = 40) -> list[Trajectory]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        ids = [rng.randrange(vocab) for _ in range(rng.randint(lo, hi))]
        out.append(Trajectory(id=i, group=i // 4, step=0, input_ids=ids, loss_mask=[0] + [1] * (len(ids) - 1),
                              behavior_logprobs=[0.0] * len(ids), turn_versions=[0], turn_spans=[(1, len(ids))]))
    return out


def _whole(model, trajs) -> list[torch.Tensor]:
    """The definition: one unchunked full-vocabulary log_softmax per trajectory."""
    with torch.no_grad():
        return [token_logprobs(model, torch.tensor([t.input_ids]))[0][0].double() for t in trajs]


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.float64, 1e-12)])
def test_chunked_logprobs_equal_one_full_vocabulary_forward(dtype, tol):
    model, trajs = _llama(3001, dtype), _trajs(3001, 13)
    chunked = learner_logprobs(model, trajs, token_budget=90, token_chunk=17, vocab_chunk=400)  # ragged chunks
    for t, a, b in zip(trajs, chunked, _whole(model, trajs)):
        assert a.shape == (len(t.input_ids),) and a.dtype == torch.float64 and float(a[0]) == 0.0
        assert float((a - b).abs().max()) <= tol


def test_chunked_logprobs_under_lora_and_the_mismatch_figures_agree():
    model = tiny_lora_llama(torch.float32, 0, ("q_proj", "v_proj"))
    trajs = _trajs(32, 9, seed=3)
    whole = _whole(model, trajs)
    for t, lp in zip(trajs, whole):  # behaviour log-probs a little off the learner's, as an engine's
        t.behavior_logprobs = [float(v) + (1e-4 if k % 2 else -1e-4) for k, v in enumerate(lp.tolist())]
    chunked = step_mismatch(model, trajs, 0)  # nothing known: every trajectory recomputed, chunked
    reference = step_mismatch(model, trajs, 0, known=dict(zip((t.id for t in trajs), whole)))
    assert chunked["mismatch/tokens"] == reference["mismatch/tokens"] > 0
    for key in ("mismatch/kl", "mismatch/max_abs"):
        assert abs(chunked[key] - reference[key]) <= 1e-6


_PEAK = r"""
import json, sys, torch
sys.path[:0] = [sys.argv[3]]
from tests.learner.test_mismatch_chunked import _llama, _trajs
from learner.grad.mismatch import learner_logprobs
from learner.grad.objectives import token_logprobs
torch.set_num_threads(1)
vocab, n, mode = 32000, 16, sys.argv[1]
model, trajs = _llama(vocab, torch.float32, layers=1), _trajs(vocab, n, lo=200, hi=200)

def rss(field):
    return int(next(line.split()[1] for line in open("/proc/self/status") if line.startswith(field))) * 1024

with torch.no_grad():
    token_logprobs(model, torch.tensor([trajs[0].input_ids[:8]]))  # lazy one-time allocations, before measuring
    learner_logprobs(model, [trajs[0]], token_budget=8, token_chunk=4, vocab_chunk=64)
    if mode == "whole":  # what the barrier did: one (B, T, V) log_softmax
        ids = torch.tensor([t.input_ids for t in trajs])
        before = rss("VmRSS")
        logp = token_logprobs(model, ids)[0]
    else:
        before = rss("VmRSS")
        logp = learner_logprobs(model, trajs, token_budget=int(sys.argv[2]), token_chunk=256, vocab_chunk=4096)
print(json.dumps({"grew": rss("VmHWM") - before, "logits_bytes": n * 200 * vocab * 4}))
"""


def _peak(mode: str, budget: int = 0) -> dict:
    import os

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, "-c", _PEAK, mode, str(budget), root], capture_output=True, text=True,
                         timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_chunked_recompute_memory_is_bounded_by_its_chunks_not_the_vocabulary():
    """16 × 200 tokens at a 32k vocabulary: the whole-vocabulary form holds 410 MB of float32
    logits (and its log_softmax as much again); the chunked form's peak is its chunks."""
    whole = _peak("whole")
    chunked = _peak("chunked", budget=800)
    print(f"peak RSS growth: whole {whole['grew'] / 2**20:.0f} MiB, chunked {chunked['grew'] / 2**20:.0f} MiB, "
          f"B x T x V x 4 = {whole['logits_bytes'] / 2**20:.0f} MiB")
    assert whole["grew"] >= whole["logits_bytes"]  # the unchunked form's memory shows
    assert chunked["grew"] <= whole["logits_bytes"] / 5  # measured 8-55 MiB (the latter before a warm-up call)


def _rank_logprobs(rank: int, world: int) -> dict:
    """One data-parallel rank: learn its own groups, pass the barrier, report its log-probs as
    ``learner.distributed.rank_worker`` does (``RankLearner.own_logprobs``); one trajectory's ledger
    entry is dropped first, which the rank must recompute itself."""
    from collections import Counter

    from learner.config import AlgorithmConfig
    from learner.checks.distributed_exactness import dist_batch, exactness_model
    from learner.distributed.rank import RankLearner
    from learner.grad.learners.common import LearnerOptions
    from learner.grad.learners.on_policy import StreamingLearner

    model = exactness_model(torch.float64, 0)
    rl = RankLearner(StreamingLearner(model, AlgorithmConfig(), None, LearnerOptions(path="per-trajectory")), rank, world)
    trajs = dist_batch(random.Random(5), 6)
    rl.begin_batch(dict(Counter(t.group for t in trajs)))
    mine = [t for t in trajs if rl.owns(t.group)]
    rl.learn(mine)
    rl.finish_batch()
    ledger = rl.learner.logprobs._by_traj
    dropped = next((i for i, lp in ledger.items() if lp is not None), None)
    ledger.pop(dropped, None)
    return {"mine": [t.id for t in mine], "dropped": dropped,
            "report": {i: None if lp is None else lp.tolist() for i, lp in rl.own_logprobs().items()}}


def test_each_rank_reports_its_own_trajectories_logprobs_for_the_mismatch_metric():
    """W = 2 over gloo: every trajectory is reported by its owner rank alone, with the log-probs
    of one whole forward (a dropped ledger entry recomputed on that rank, chunked), so rank 0
    has them all and forwards none of the other ranks' trajectories at the barrier."""
    from learner.checks.distributed_exactness import dist_batch, exactness_model
    from learner.distributed.ranks import spawn_ranks

    results = spawn_ranks(_rank_logprobs, 2, (), timeout_s=300)
    trajs = {t.id: t for t in dist_batch(random.Random(5), 6)}
    model = exactness_model(torch.float64, 0)
    seen: set[int] = set()
    for r in results:
        assert set(r["report"]) == set(r["mine"])  # its own trajectories, every one of them
        assert not seen & set(r["report"])
        seen |= set(r["report"])
        assert r["dropped"] is not None and r["report"][r["dropped"]] is not None  # recomputed on the rank
        for i, lp in r["report"].items():
            if lp is None:  # skipped by the learner (A = 0): left out of the metric, never forwarded
                continue
            whole = _whole(model, [trajs[i]])[0]
            assert len(lp) == len(trajs[i].input_ids)
            assert float((torch.tensor(lp, dtype=torch.float64) - whole).abs().max()) <= 1e-12
    assert seen == set(trajs)
