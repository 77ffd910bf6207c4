"""Shared-prompt backward (``learner.shared_prompt_backward``, learner/grad/batching/shared_prompt.py): a
completion forward against its group's prompt keys/values, the learners' gradients against the
reference, the memory bound, and the config's refusals."""

import random
from collections import Counter

import pytest
import torch

from learner.config import LOSS_AGG_MODES, AlgorithmConfig, ConfigError, parse_config
from learner.checks import exactness
from learner.checks.exactness import CaseSpec, random_batch, relative_error, run_case, tiny_llama
from learner.grad.learners.common import LearnerOptions
from learner.grad.batching.microbatch import Row, forward
from learner.grad.learners.on_policy import StreamingLearner
from learner.grad.reference import reference_gradient
from learner.grad.batching.shared_prompt import PromptKV, SharedPrompts, prompt_cut


def test_completions_against_prompt_keys_values_match_whole_rows():
    model = tiny_llama(torch.float64, 0)
    rng = random.Random(3)
    prompts = {0: [rng.randrange(32) for _ in range(7)], 1: [rng.randrange(32) for _ in range(3)]}
    rows = [Row(k, g, prompts[g] + [rng.randrange(32) for _ in range(n)], [0] * len(prompts[g]) + [1] * n)
            for k, (g, n) in enumerate([(0, 4), (1, 6), (0, 2)])]
    prompts_kv = SharedPrompts(model, None, max_tokens=100)
    prompts_kv.begin({0: 2, 1: 1})
    cut = [prompts_kv.cut(r) for r in rows]
    assert [r.prompt for r in cut] == [6, 2, 6]  # the last prompt token starts the completion forward
    past, groups = prompts_kv.past(cut, with_ref=False)
    fwd = forward(model, None, AlgorithmConfig(), cut, past=past)
    for k, row in enumerate(rows):
        alone = forward(model, None, AlgorithmConfig(), [row]).logp[0]
        p = cut[k].prompt + 1  # the completion's log-probs; the prompt's, unscored, are not computed (0)
        assert torch.allclose(fwd.row_logp(k)[p:], alone[p:], atol=1e-12, rtol=0)
        assert not fwd.row_logp(k)[:p].any()
    assert groups == [0, 1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("learner,cap", [("micro-batched", None), ("adaptive", 0), ("adaptive", 2),
                                         ("adaptive", None)])
@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_shared_prompt_learners_match_the_reference(mode, learner, cap, dtype):
    spec = CaseSpec("grpo", mode, "unbiased", dtype, learner, cap, aux="on", shared_prompt=True)
    case = run_case(spec, random.Random(spec.seed_key(7, 0)))
    assert case["passed"], case
    assert case["shared_prompt_rows"] > 0


def test_the_prompts_cotangent_carries_gradient(monkeypatch):
    spec = CaseSpec("grpo", "token-mean", "unbiased", torch.float64, "adaptive", 2, shared_prompt=True)
    monkeypatch.setattr(PromptKV, "cotangent", lambda self: None)  # the prompt's backward dropped
    assert run_case(spec, random.Random(spec.seed_key(7, 0)))["rel_error"] > 1e-3


def _learn(model, trajs, options, algo=AlgorithmConfig()):
    learner = StreamingLearner(model, algo, None, options)
    learner.begin_batch(dict(Counter(t.group for t in trajs)))
    learner.learn(trajs)
    stats = learner.finish_batch()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return grads, stats


def test_each_group_shares_one_prompt_within_the_memory_bound():
    model = tiny_llama(torch.float64, 4)
    trajs = random_batch(random.Random(11), shared_prompt=True)
    algo = AlgorithmConfig(entropy_coef=0.05)  # no member skipped (A = 0 alone would be): every group learnt
    ref = reference_gradient(model, trajs, algo)
    n_groups = len({t.group for t in trajs})
    cuts = {t.group: prompt_cut(t.input_ids, t.loss_mask) for t in trajs}
    for bound, shared in ((10_000, n_groups), (max(cuts.values()), None)):
        grads, stats = _learn(model, trajs, LearnerOptions("micro-batched", shared_prompt_backward=True,
                                                           shared_prompt_max_tokens=bound), algo)
        assert relative_error(grads, ref) < 1e-12
        if shared is not None:
            assert stats["shared_prompt_groups"] == shared
        else:  # the bound fits fewer prompts at once than the batch has groups: the others plain
            assert 1 <= stats["shared_prompt_groups"] < n_groups
            assert stats["shared_prompt_rows"] < len(trajs)


def test_shared_prompt_specs_cover_every_mode_and_open_group_cap():
    specs = [s for s in exactness.case_specs() if s.shared_prompt]
    covered = {(s.mode, s.dtype, s.learner, s.open_group_cap) for s in specs}
    for dtype in (torch.float32, torch.float64):
        for mode in LOSS_AGG_MODES:
            assert {(mode, dtype, "micro-batched", None)} | {(mode, dtype, "adaptive", k) for k in (0, 2, None)} <= covered


@pytest.mark.parametrize("overrides,names", [
    ({"train": {"schedule": "async"}}, "not async"),
    ({"algorithm": {"objective": "opd", "loss_agg_mode": "token-mean"}}, "not objective opd"),
])
def test_unsupported_paths_are_refused_naming_the_field(overrides, names):
    data = {"train": {"schedule": "streaming"}, "learner": {"shared_prompt_backward": True}}
    for section, values in overrides.items():
        data.setdefault(section, {}).update(values)
    with pytest.raises(ConfigError, match=f"learner.shared_prompt_backward: .*{names}"):
        parse_config(data)
    assert parse_config({"learner": {"shared_prompt_backward": True}}).learner.shared_prompt_backward


@pytest.mark.parametrize("overrides", [{"model": {"lora": {"rank": 4}}}, {"learner": {"world_size": 2}},
                                       {"learner": {"world_size": 2}, "train": {"schedule": "sync"}},
                                       {"learner": {"world_size": 2, "engine": "deepspeed", "zero_stage": 2}}])
def test_lora_and_data_parallel_ranks_take_the_shared_prompt_backward(overrides):
    data = {"learner": {"shared_prompt_backward": True}}
    for section, values in overrides.items():
        data.setdefault(section, {}).update(values)
    assert parse_config(data).learner.shared_prompt_backward


def test_the_preamble_starts_every_arith_tool_prompt_and_only_there():
    from learner.config import TaskConfig
    from learner.tasks.env import ArithToolEnv

    task = ArithToolEnv(TaskConfig(prompt_preamble="Tools follow")).sample_task(random.Random(0))
    assert task.prompt_text.startswith("<bos>Q:Tools follow\n") and task.messages[0]["content"].startswith("Tools")
    with pytest.raises(ConfigError, match="task.prompt_preamble: arith-tool only"):
        parse_config({"task": {"name": "dataset", "path": "configs/data/math.jsonl", "prompt_preamble": "x"}})


@pytest.mark.slow
def test_the_long_prompt_config_trains_with_shared_prompts_and_its_dump_passes_the_audit(tmp_path):
    import json
    import subprocess
    import sys

    import yaml

    cfg = yaml.safe_load(open("configs/long-prompt.yaml"))
    assert len(cfg["task"]["prompt_preamble"]) >= 512  # the built-in tokenizer: one token per character
    cfg["train"].update(prompts_per_step=2, group_size=4)
    cfg["learner"]["shared_prompt_backward"] = True
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    dump, events = tmp_path / "dump", tmp_path / "events.jsonl"
    cli = [sys.executable, "-m", "learner.cli"]
    r = subprocess.run(cli + ["train", "--config", str(tmp_path / "c.yaml"), "--steps", "2", "--dump-step", str(dump),
                              "--dump-at", "1", "--events", str(events), "--quiet"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    steps = [json.loads(line)["values"] for line in events.read_text().splitlines() if '"metrics"' in line]
    assert [s["learner/shared_prompt_rows"] for s in steps] == [8.0, 8.0]
    grads = torch.load(dump / "grad.pt", weights_only=True)
    assert sum(float(g.square().sum()) for g in grads.values()) > 0
    audit = subprocess.run(cli + ["audit", str(dump)], capture_output=True, text=True, timeout=600)
    assert audit.returncode == 0 and json.loads(audit.stdout)["passed"], audit.stdout + audit.stderr
