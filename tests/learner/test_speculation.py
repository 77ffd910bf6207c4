"""Cross-iteration speculation in a rollout worker (docs/speculation.md): trajectories drafted
under weights θ_k and verified against θ_{k+1} when their step's Work arrives equal, token for
token, the ones a worker samples directly under θ_{k+1}, whether the drafts finished, were cut
mid-turn to yield the engine, or never started (budget); GRPO and OPD; and the config refuses
what speculation cannot do."""

from __future__ import annotations

import queue
import random
import time

import pytest
import torch

from learner.config import ConfigError, RunConfig, parse_config
from learner.checks.speculation_exactness import drifted, speculation_cases
from learner.checks.tiny_models import VOCAB, tiny_llama
from learner.tasks.chat import turn_stop_ids
from learner.rollout.speculation.drafts import speculation_refused
from learner.rollout.engine.torch_engine import TorchEngine
from learner.tasks.env import ArithToolEnv
from learner.rollout.engine.kv_keep import KeepKV
from learner.rollout.processes.messages import Draft, Finished, Work, WorkItem
from learner.models.loading import load_model, load_tokenizer, resolve_model_dir
from learner.rollout.engine.prefix_store import PrefixStore
from learner.rollout.engine.sampling import SamplingParams, Stream
from learner.tasks.sandbox_task import PythonSandboxEnv
from learner.rollout.speculation.token_verify import Sampled, verify
from learner.rollout.processes.agent_worker import AgentWorker
from learner.timeline import Kind
from learner.trajectory import ScoredTurn, Trajectory

LOGPROB_ATOL = 5e-5  # the same token's log-prob from a prefill vs a decode forward (round-off)
N = 24


def config(budget: int = 65_536) -> RunConfig:
    return RunConfig.model_validate({
        "task": {"tool_latency": {"distribution": "constant", "median_s": 0.005}},
        "rollout": {"speculation": {"enabled": True, "draft_token_budget": budget}}})


def perturbed(model: torch.nn.Module, scale: float) -> dict[str, torch.Tensor]:
    """θ_{k+1}: θ_k moved a little (an optimizer step's worth of drift)."""
    gen = torch.Generator().manual_seed(3)
    return {n: p.detach() + scale * p.detach().abs().mean() * torch.randn(p.shape, generator=gen)
            for n, p in model.named_parameters()}


def make_worker(cfg: RunConfig, teacher=None):
    policy = resolve_model_dir("builtin:tiny")
    tok = load_tokenizer(policy)
    engine = TorchEngine(load_model(policy), tok.pad_token_id, continuous_batching=True, reuse_kv=True)
    worker = AgentWorker(0, cfg, engine, tok, teacher, None, queue.Queue(), time.monotonic(),
                         stop_ids=turn_stop_ids(tok, policy))
    return worker, engine


def items(cfg: RunConfig) -> list[WorkItem]:
    env = ArithToolEnv(cfg.task)
    return [WorkItem(100 + i, i // 4, env.sample_task(random.Random(i // 4)), 77 + i) for i in range(N)]


def received(worker) -> tuple[list[Trajectory], list[ScoredTurn], list]:
    trajs, turns, spans = [], [], []
    while not worker.out_q.empty():
        msg = worker.out_q.get_nowait()
        spans += msg.spans
        if isinstance(msg, Finished):
            (trajs if isinstance(msg.item, Trajectory) else turns).append(msg.item)
    return sorted(trajs, key=lambda t: t.id), sorted(turns, key=lambda s: (s.traj, s.turn)), spans


def direct(cfg: RunConfig, new: dict, teacher=None):
    worker, engine = make_worker(cfg, teacher)
    engine.load_weights(new, version=1)
    worker.handle(Work(1, items(cfg)))
    worker.run_loops(timeout_s=120)
    return received(worker)


def speculative(cfg: RunConfig, new: dict, teacher=None, cut_every: int = 0):
    worker, engine = make_worker(cfg, teacher)
    if cut_every:  # a driver command "waits" every few decode steps: drafts are cut mid-turn
        calls = iter(range(10**9))
        worker.commands_waiting = lambda: next(calls) % cut_every == cut_every - 1
    worker.handle(Draft(1, items(cfg)))
    worker.run_loops(timeout_s=120)  # the drafts run to their end (parked) under θ_k
    assert worker.out_q.empty() or not any(isinstance(m, Finished) for m in list(worker.out_q.queue))
    worker.commands_waiting = lambda: False
    engine.load_weights(new, version=1)
    worker.handle(Work(1, items(cfg)))
    worker.run_loops(timeout_s=120)
    return received(worker)


def assert_same(a: list[Trajectory], b: list[Trajectory]) -> None:
    assert [t.id for t in a] == [t.id for t in b] and len(a) == N
    for x, y in zip(a, b):
        assert (x.input_ids, x.loss_mask, x.turn_spans, x.reward, x.turn_versions) == \
               (y.input_ids, y.loss_mask, y.turn_spans, y.reward, y.turn_versions)
        assert max(abs(p - q) for p, q in zip(x.behavior_logprobs, y.behavior_logprobs)) < LOGPROB_ATOL


@pytest.mark.parametrize("scale,cut_every,budget", [
    (0.05, 3, 65_536),  # drafts cut mid-turn every few decode steps, some rejected
    pytest.param(0.0, 0, 65_536, marks=pytest.mark.slow),
    pytest.param(0.05, 0, 65_536, marks=pytest.mark.slow),
    pytest.param(0.05, 0, 200, marks=pytest.mark.slow),
])
def test_verified_drafts_equal_direct_sampling(scale: float, cut_every: int, budget: int) -> None:
    cfg = config(budget)
    worker, _ = make_worker(cfg)
    new = perturbed(worker.engine.model, scale)
    ref, _, _ = direct(cfg, new)
    got, _, spans = speculative(cfg, new, cut_every=cut_every)
    assert_same(ref, got)
    assert sum(len(t.turn_spans) > 1 for t in got) >= 3, "some loops should call the calculator"
    drafted = [t for t in got if t.drafted_tokens]
    assert drafted and {Kind.DRAFT, Kind.DRAFT_VERIFY} <= {s.kind for s in spans}
    assert all(v in (-1, 0) for t in got for v in t.drafted_versions)
    if scale == 0.0:  # the same weights: every draft is kept whole and finished at once
        assert all(t.kept_tokens == t.drafted_tokens for t in drafted) and len(drafted) == N
    else:
        assert any(t.kept_tokens < t.drafted_tokens for t in drafted)
    if budget < 1000:
        assert len(drafted) < N  # the budget held some drafts back: they started afresh


@pytest.mark.slow
def test_opd_kept_turns_keep_their_teacher_scores() -> None:
    cfg = config()
    teacher = load_model(resolve_model_dir("builtin:teacher"))
    worker, _ = make_worker(cfg)
    new = perturbed(worker.engine.model, 0.05)
    ref, ref_turns, _ = direct(cfg, new, teacher)
    got, got_turns, _ = speculative(cfg, new, teacher)
    assert_same(ref, got)
    assert [(s.traj, s.turn, s.input_ids, s.turn_span, s.policy_version) for s in ref_turns] == \
           [(s.traj, s.turn, s.input_ids, s.turn_span, s.policy_version) for s in got_turns]
    for a, b in zip(ref_turns, got_turns):
        assert max(abs(p - q) for p, q in zip(a.teacher_logprobs, b.teacher_logprobs)) < LOGPROB_ATOL
    for a, b in zip(ref, got):
        assert [x is None for x in a.teacher_logprobs] == [x is None for x in b.teacher_logprobs]


@pytest.mark.parametrize("override,field", [
    ({"train": {"schedule": "async"}}, "rollout.speculation: drafts are verified"),
    ({"train": {"schedule": "fully-async"}}, "rollout.speculation: drafts are verified"),
    ({"rollout": {"continuous_batching": False}}, "rollout.speculation: needs continuous_batching"),
])
def test_config_refuses_what_speculation_cannot_do(override: dict, field: str) -> None:
    data = {"rollout": {"speculation": {"enabled": True}}}
    for key, value in override.items():
        data.setdefault(key, {}).update(value)
    with pytest.raises(ConfigError, match=field):
        parse_config(data)


def test_the_vllm_engine_may_speculate() -> None:
    """vLLM samples keyed too (rollout/vllm_backend/vllm_keyed.py) and batches continuously itself."""
    cfg = parse_config({"rollout": {"engine": "vllm", "continuous_batching": False, "speculation": {"enabled": True}}})
    assert cfg.rollout.speculation.enabled and cfg.rollout.engine == "vllm"


def test_a_stateful_environment_refuses_speculation() -> None:
    cfg = parse_config({"task": {"name": "python-sandbox"}})
    assert "rollout.speculation: task python-sandbox" in speculation_refused(PythonSandboxEnv(cfg.task))
    assert speculation_refused(ArithToolEnv(cfg.task)) is None


def test_check_exactness_verifies_against_direct_sampling() -> None:
    """The ``thundersync check-exactness`` case: random tiny models, several drifts and (T, top-p)."""
    cases = speculation_cases(seed=1)
    assert all(c["passed"] for c in cases), cases
    assert min(c["kept_token_share"] for c in cases) < 1.0  # some drafts were rejected and sampled on


def test_shared_prefix_verification_matches_the_whole_context_forward() -> None:
    """A group's drafts share their prompt: forwarding it once and each remainder on its keys/values
    gives the verdicts (and, to round-off, the log-probs) of one forward per whole draft."""
    model = tiny_llama(torch.float32, 5)
    rng = random.Random(5)
    prompts = [[rng.randrange(1, VOCAB) for _ in range(rng.randint(2, 12))] for _ in range(3)]
    views = []
    for g, p in enumerate(prompts):
        for r in range(4):  # a group of 4, drafts of different lengths (two turns for some)
            tail = [rng.randrange(1, VOCAB) for _ in range(rng.randint(1, 20))]
            positions = list(range(len(p), len(p) + len(tail)))
            views.append(Sampled(p + tail, positions, [Stream(1000 * g + r, n) for n in range(len(tail))]))
    whole = verify(model, views, 1.0, 1.0, pad_id=0, share_prefix=False)
    shared = verify(model, views, 1.0, 1.0, pad_id=0)
    assert [(v.kept, v.token) for v in shared] == [(v.kept, v.token) for v in whole]
    assert max(abs(a - b) for v, w in zip(shared, whole) for a, b in zip(v.logprobs, w.logprobs)) < LOGPROB_ATOL


def test_a_rejected_drafts_remainder_starts_from_the_verification_kv() -> None:
    """Every rejected draft's kept context goes from the verification forward to the prefix store,
    and its remainder's next generate takes it: the prefill tokens reused after the weight load
    grow by exactly those contexts against the same run with it off, and the tokens stay direct
    sampling's."""
    cfg = config()
    worker, _ = make_worker(cfg)
    new = perturbed(worker.engine.model, 0.05)
    ref, _, _ = direct(cfg, new)
    reused, got = {}, {}
    for keep in (False, True):
        cfg.rollout.speculation.reuse_verified_kv = keep
        worker, engine = make_worker(cfg)
        engine.prefixes.min_tokens = 1  # these contexts are short: keep every one
        worker.handle(Draft(1, items(cfg)))
        worker.run_loops(timeout_s=120)
        engine.load_weights(new, version=1)  # (drops every entry the drafts kept under θ_k)
        before = engine.prefixes.tokens_reused
        worker.handle(Work(1, items(cfg)))
        worker.run_loops(timeout_s=120)
        got[keep], reused[keep] = received(worker)[0], engine.prefixes.tokens_reused - before
        assert_same(ref, got[keep])
        assert len(engine.prefixes) == 0 and engine.prefixes.held_tokens() == 0  # every entry taken or dropped
    rejected = [t for t in got[True] if t.drafted_tokens and t.kept_tokens < t.drafted_tokens]
    assert any(t.verified_kv_tokens for t in rejected) and not any(t.verified_kv_tokens for t in got[False])
    # after the load the calls differ only in the remainders' first prefill (a remainder that ended
    # with its corrected token used nothing and counts 0)
    assert reused[True] - reused[False] == sum(t.verified_kv_tokens for t in got[True]) > 0


@pytest.mark.parametrize("share_prefix", [True, False])
def test_kept_verification_kv_equals_a_prefill_of_the_kept_context(share_prefix: bool) -> None:
    """The block ``kv_keep`` gathers out of either verification forward holds, per row and
    right-aligned, the keys/values a fresh forward of its kept context computes (a rejected draft's
    context before its first differing position; an unfinished draft kept whole, all but its last
    token); rows are kept shortest first within the bound."""
    model = tiny_llama(torch.float32, 5)
    engine = TorchEngine(model, pad_id=0)
    rng = random.Random(7)
    rows = [p for p in [[rng.randrange(1, VOCAB) for _ in range(rng.randint(2, 12))] for _ in range(3)] for _ in range(4)]
    drafted = engine.generate(rows, SamplingParams(20, []), seeds=list(range(len(rows))))  # θ_k's drafts
    engine.load_weights(drifted(model, 0.1, 1), version=1)  # θ_{k+1}
    views = [Sampled(p + c.token_ids, list(range(len(p), len(p) + len(c.token_ids))),
                     [Stream(b, n) for n in range(len(c.token_ids))]) for b, (p, c) in enumerate(zip(rows, drafted))]
    store = PrefixStore(min_tokens=1)
    verdicts = verify(model, views, 1.0, 1.0, pad_id=0, share_prefix=share_prefix,
                      keep=KeepKV(store, list(range(len(views))), 10**9, [True] * len(views)))
    assert {v.token is None for v in verdicts} == {True, False}  # some kept whole, some rejected
    assert len(store) == len(views)
    for b, (view, verdict) in enumerate(zip(views, verdicts)):
        n = verdict.kv_tokens
        assert n == (len(view.ids) - 1 if verdict.token is None else view.positions[verdict.kept])
        entry = store._entries[b]
        assert entry.tokens == view.ids[:n] and int(entry.block.mask[entry.row].sum()) == n
        fresh = model(input_ids=torch.tensor([view.ids[:n]]), use_cache=True).past_key_values
        for (keys, values), layer in zip(entry.block.layers, fresh.layers):
            assert torch.allclose(keys[entry.row, :, -n:], layer.keys[0], atol=1e-5)
            assert torch.allclose(values[entry.row, :, -n:], layer.values[0], atol=1e-5)
    shortest = sorted(v.kv_tokens for v in verdicts)
    bound = PrefixStore(min_tokens=1)
    kept = verify(model, views, 1.0, 1.0, pad_id=0, share_prefix=share_prefix,
                  keep=KeepKV(bound, list(range(len(views))), 2 * shortest[1], [True] * len(views)))
    assert len(bound) == 2 and bound.held_tokens() <= 2 * shortest[1]  # the two shortest: 2 rows x the longer
    assert sorted(v.kv_tokens for v in kept if v.kv_tokens) == shortest[:2]
