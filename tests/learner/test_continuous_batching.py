"""Continuous batching in the torch engine, through the real agent loop: a loop whose tool
answered (and whose modelled latency ended) while a generate call ran joins that call, and the
trajectories are the same as with one fixed batch per call (docs/architecture.md, "Torch
engine: continuous batching"); each turn's generate span starts when its row joined, after its tool's spans."""

from __future__ import annotations

import queue
import random
import time

import pytest

from learner.config import ConfigError, RunConfig, parse_config
from learner.tasks.chat import turn_stop_ids
from learner.rollout.engine.torch_engine import TorchEngine
from learner.tasks.env import ArithToolEnv
from learner.rollout.processes.messages import Finished, Work, WorkItem
from learner.models.loading import load_model, load_tokenizer, resolve_model_dir
from learner.rollout.processes.agent_worker import AgentWorker
from learner.timeline import Kind
from learner.trajectory import Trajectory

# The same token's float32 log-prob under different batch shapes (fixed batch, rows joining a
# running call, a row cap, a reused prefix) differs by round-off: up to 7.3e-6 here alone and
# 1.4e-5 once in a full CI run (30-60 ulps at |log p| ~ 2), so "the same" means within this.
LOGPROB_ATOL = 5e-5


def run(continuous: bool, n: int = 24, cap: int | None = None, live_rows: list | None = None,
        reuse_kv: bool = False, prefill_tokens: list | None = None):
    policy = resolve_model_dir("builtin:tiny")
    tok = load_tokenizer(policy)
    # a short constant modelled latency (labelled: task.tool_latency) ends while other rows decode
    cfg = RunConfig.model_validate({"task": {"tool_latency": {"distribution": "constant", "median_s": 0.01}},
                                    "rollout": {"continuous_batching": continuous, "max_running_rows": cap}})
    engine = TorchEngine(load_model(policy), tok.pad_token_id, continuous_batching=continuous, reuse_kv=reuse_kv)
    if reuse_kv:
        engine.prefixes.min_tokens = 1  # these contexts are short: keep every one
    if live_rows is not None or prefill_tokens is not None:
        forward = engine.model.forward

        def recording_forward(*args, **kwargs):
            if kwargs["input_ids"].shape[1] == 1 and live_rows is not None:
                live_rows.append(int(kwargs["attention_mask"][:, -1].sum()))  # rows still sampling
            elif kwargs["input_ids"].shape[1] > 1 and prefill_tokens is not None:
                prefill_tokens.append(int(kwargs["input_ids"].numel()))  # tokens a prefill forwards
            return forward(*args, **kwargs)

        engine.model.forward = recording_forward
    worker = AgentWorker(0, cfg, engine, tok, None, None, queue.Queue(), time.monotonic(),
                         stop_ids=turn_stop_ids(tok, policy))
    env = ArithToolEnv(cfg.task)
    items = [WorkItem(i, i // 4, env.sample_task(random.Random(i // 4)), 11 + i) for i in range(n)]
    worker.handle(Work(0, items))
    worker.run_loops(timeout_s=120)
    trajs, spans = [], []
    while not worker.out_q.empty():
        msg = worker.out_q.get_nowait()
        spans += msg.spans
        if isinstance(msg, Finished) and isinstance(msg.item, Trajectory):
            trajs.append(msg.item)
    return sorted(trajs, key=lambda t: t.id), spans, engine.stats


def test_loops_join_running_calls_and_sample_the_same_trajectories():
    fixed, _, _ = run(continuous=False)
    cont, spans, stats = run(continuous=True)
    assert len(cont) == len(fixed) == 24
    assert sum(len(t.turn_spans) > 1 for t in cont) >= 3, "some loops should call the calculator"
    assert stats.extra.get("rows_admitted", 0) > 0  # turns started inside a running call
    for a, b in zip(fixed, cont):
        assert (a.id, a.input_ids, a.loss_mask, a.turn_spans, a.reward) == (b.id, b.input_ids, b.loss_mask, b.turn_spans, b.reward)
        assert max(abs(x - y) for x, y in zip(a.behavior_logprobs, b.behavior_logprobs)) < LOGPROB_ATOL
    # spans stay honest: a turn's generate span starts after its previous turn's tool and wait
    by_traj: dict[int, list] = {}
    for s in spans:
        by_traj.setdefault(s.traj, []).append(s)
    for traj in cont:
        own = sorted(by_traj[traj.id], key=lambda s: (s.t0, s.t1))
        gens = [s for s in own if s.kind == Kind.GENERATE]
        assert [s.turn for s in gens] == list(range(len(traj.turn_spans)))
        for earlier, later in zip(own, own[1:]):
            assert later.t0 >= earlier.t1 - 1e-9, (earlier, later)  # one phase at a time per loop


def test_later_turns_reuse_their_kept_keys_and_values_and_sample_the_same_trajectories():
    fixed, _, _ = run(continuous=False)
    full: list[int] = []
    run(continuous=True, prefill_tokens=full)
    reused: list[int] = []
    cont, _, stats = run(continuous=True, reuse_kv=True, prefill_tokens=reused)
    later_turns = sum(len(t.turn_spans) - 1 for t in cont)
    assert later_turns >= 3 and stats.extra.get("rows_admitted", 0) > 0
    assert stats.extra.get("prefill_tokens_reused", 0) > 0
    # a later turn forwards only its new tokens (the sampled token not fed yet and the tool's answer)
    assert sum(reused) < sum(full), (sum(reused), sum(full))
    for a, b in zip(fixed, cont, strict=True):
        assert (a.id, a.input_ids, a.loss_mask, a.turn_spans, a.reward) == (b.id, b.input_ids, b.loss_mask, b.turn_spans, b.reward)
        assert max(abs(x - y) for x, y in zip(a.behavior_logprobs, b.behavior_logprobs)) < LOGPROB_ATOL


def test_a_row_cap_runs_later_turns_first_and_samples_the_same_trajectories():
    fixed, _, _ = run(continuous=False)
    live: list[int] = []
    capped, _, stats = run(continuous=True, cap=5, live_rows=live)
    assert max(live) <= 5 and stats.extra.get("rows_admitted", 0) > 0
    for a, b in zip(fixed, capped, strict=True):
        assert (a.id, a.input_ids, a.turn_spans, a.reward) == (b.id, b.input_ids, b.turn_spans, b.reward)
        assert max(abs(x - y) for x, y in zip(a.behavior_logprobs, b.behavior_logprobs)) < LOGPROB_ATOL


@pytest.mark.parametrize("rollout", [{"continuous_batching": False, "max_running_rows": 64},
                                     {"engine": "vllm", "max_running_rows": 64}, {"max_running_rows": 0}])
def test_a_row_cap_is_validated_naming_the_field(rollout):
    with pytest.raises(ConfigError) as err:
        parse_config({"rollout": rollout})
    assert str(err.value).startswith(("rollout.max_running_rows: ", "rollout: max_running_rows: ")), str(err.value)


@pytest.mark.parametrize("value", ["many", [1]])
def test_continuous_batching_is_validated_naming_the_field(value):
    with pytest.raises(ConfigError) as err:
        parse_config({"rollout": {"continuous_batching": value}})
    assert str(err.value).startswith("rollout.continuous_batching: ")
