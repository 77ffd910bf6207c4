"""Randomised check that the streaming learner reproduces the batch-synchronous gradient (docs/math.md).

For every objective × loss_agg_mode × advantage.std × dtype, seeded random batches (groups of
size 1..5, all-equal / binary / continuous / offset-100 rewards, multi-turn masks with
unscored observation tokens, random KL and entropy coefficients) are fed to
``StreamingLearner`` in a random arrival order that interleaves groups (GRPO) or turns (OPD),
and compared with ``reference_gradient``:

    rel_error = ‖g_stream − g_ref‖ / ‖g_ref‖ ≤ 1e-6 (float32), 1e-12 (float64).

The model is a tiny random LlamaForCausalLM built from a LlamaConfig: nothing is downloaded.
Run: ``python -m learner.checks.exactness [--json]`` (the CLI wires ``thundersync check-exactness``).
"""

from __future__ import annotations

import json
import math
import random
import sys
from collections import Counter
from dataclasses import dataclass

import torch

from learner.config import LOSS_AGG_MODES, STD_MODES, AdvantageConfig, AlgorithmConfig
from learner.grad.batching.cost_model import DRAIN_POLICIES, BackwardCosts
from learner.grad.learners.deterministic import on_policy_learner
from learner.grad.learners.common import LEARNER_PATHS, LearnerOptions
from learner.grad.objectives import OPD_LOSS_AGG_MODES
from learner.grad.reference import reference_gradient
from learner.checks.speculation_exactness import print_cases, speculation_cases
from learner.checks.tiny_models import INIT_STD, VOCAB, tiny_llama, tiny_lora_llama  # noqa: F401  (the tests' models)
from learner.trajectory import ScoredTurn, Trajectory
from learner.registries.objectives import objective as objective_of

TOLERANCE = {torch.float32: 1e-6, torch.float64: 1e-12}
REWARD_KINDS = ("binary", "continuous", "offset", "equal")


def random_rewards(rng: random.Random, size: int, kind: str) -> list[float]:
    if kind == "binary":
        return [float(rng.random() < 0.5) for _ in range(size)]
    if kind == "continuous":
        return [rng.gauss(0.0, 1.0) for _ in range(size)]
    if kind == "offset":  # a large common offset: the cancellation the shifted T'_k avoids
        return [100.0 + rng.gauss(0.0, 0.05) for _ in range(size)]
    value = rng.choice([0.1, 1.0, 100.3])  # 0.1·3 is not 0.3 in floats: μ must still equal 0.1
    return [value] * size


def random_trajectory(rng: random.Random, traj_id: int, group: int, reward: float,
                      prompt: list[int] | None = None) -> Trajectory:
    """Prompt (``prompt``, or 2–5 random tokens), then 1–3 generated turns separated by unscored
    observation tokens."""

    def draw(n: int) -> list[int]:
        return [rng.randrange(VOCAB) for _ in range(n)]

    ids = list(prompt) if prompt is not None else draw(rng.randint(2, 5))
    mask = [0] * len(ids)
    spans = []
    for turn in range(rng.randint(1, 3)):
        if turn:
            obs = rng.randint(1, 3)
            ids, mask = ids + draw(obs), mask + [0] * obs
        n = rng.randint(1, 6)
        spans.append((len(ids), len(ids) + n))
        ids, mask = ids + draw(n), mask + [1] * n
    teacher = [-(0.05 + 3 * rng.random()) if m else None for m in mask]
    return Trajectory(
        id=traj_id, group=group, step=0, input_ids=ids, loss_mask=mask, behavior_logprobs=[0.0] * len(ids),
        reward=reward, turn_versions=[0] * len(spans), turn_spans=spans, teacher_logprobs=teacher,
    )


def random_batch(rng: random.Random, shared_prompt: bool = False) -> list[Trajectory]:
    """2–4 groups of size 1–5; group 0 has ≥ 2 distinct-ish rewards so the gradient is not all aux.
    ``shared_prompt``: a group's members share a prompt of 2–12 tokens (a member in ten has its
    own, which the shared-prompt backward must learn the ordinary way)."""
    trajs = []
    for group in range(rng.randint(2, 4)):
        size = rng.randint(2, 5) if group == 0 else rng.randint(1, 5)
        kind = rng.choice(("continuous", "offset")) if group == 0 else rng.choice(REWARD_KINDS)
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(2, 12))] if shared_prompt else None
        for reward in random_rewards(rng, size, kind):
            own = prompt is not None and rng.random() < 0.1
            trajs.append(random_trajectory(rng, len(trajs), group, reward, None if own else prompt))
    return trajs


def scored_turns(traj: Trajectory) -> list[ScoredTurn]:
    return [
        ScoredTurn(
            traj=traj.id, group=traj.group, step=traj.step, turn=k, input_ids=traj.input_ids[:end],
            turn_span=(start, end), teacher_logprobs=traj.teacher_logprobs[start:end],
            behavior_logprobs=traj.behavior_logprobs[start:end], policy_version=0,
        )
        for k, (start, end) in enumerate(traj.turn_spans)
    ]


def arrival_chunks(items: list, learner_path: str, rng: random.Random) -> list[list]:
    """How the items reach the learner: micro-batched: the whole batch at once (sync);
    per-trajectory: one at a time; adaptive: random drains of 1–6 items (a queue that builds up
    while the learner is busy), the arrival order already shuffled by the caller."""
    if learner_path == "micro-batched":
        return [items]
    if learner_path == "per-trajectory":
        return [[x] for x in items]
    chunks, i = [], 0
    while i < len(items):
        n = rng.choice((1, 1, 2, 3, 6))
        chunks.append(items[i:i + n])
        i += n
    return chunks


def early_work_everywhere() -> BackwardCosts:
    """A ``cost-aware`` fit under which its early work runs wherever its rules allow it: a second
    per token slot (whatever waits would spill far past the rollout's end) at a nanosecond per row
    (an open bucket ends long before the last arrival, its premium fits any allowance)."""
    costs = BackwardCosts()
    costs.observe(100, 10**11, 100.0, open_group=False)
    return costs


def streamed_gradient(
    model: torch.nn.Module, ref_model: torch.nn.Module, algo: AlgorithmConfig, trajs: list[Trajectory],
    rng: random.Random, options: LearnerOptions | None = None, costs: BackwardCosts | None = None,
    idle: float = 0.4,
) -> tuple[dict[str, torch.Tensor], dict]:
    """Feed the batch in a random order (adaptive: random drains, and ``idle_work`` called at random
    between them, as a driver with an empty queue would); returns (p.grad by name, batch stats +
    the most groups open at once). ``costs``: the drain policy's measurements to start from."""
    options = options or LearnerOptions(path="per-trajectory")
    learner = on_policy_learner(model, algo, ref_model, options)
    if costs is not None:
        learner.policy.costs = costs
    learner.begin_batch(dict(Counter(t.group for t in trajs)))
    if objective_of(algo.objective).group_advantage:
        items = rng.sample(trajs, len(trajs))
    else:  # turns in a random order; a trajectory ends after its own turns
        turns = [turn for traj in trajs for turn in scored_turns(traj)]
        items = rng.sample(turns, len(turns)) + rng.sample(trajs, len(trajs))
    max_open = 0
    for chunk in arrival_chunks(items, options.path, rng):
        learner.learn(chunk)
        max_open = max(max_open, len(learner.acc.open_groups))
        while options.path == "adaptive" and rng.random() < idle and learner.idle_work():
            max_open = max(max_open, len(learner.acc.open_groups))
    stats = learner.finish_batch()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad}  # LoRA: adapters
    model.zero_grad(set_to_none=True)
    return grads, {**stats, "max_open_groups": max_open}


def relative_error(got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> float:
    diff = math.sqrt(sum(float((got[n].double() - ref[n].double()).square().sum()) for n in ref))
    norm = math.sqrt(sum(float(ref[n].double().square().sum()) for n in ref))
    return diff / norm if norm > 0 else (0.0 if diff == 0 else math.inf)


@dataclass(frozen=True)
class CaseSpec:
    """One randomised case: the conventions, the learner path and its open-group cap K."""

    objective: str
    mode: str
    std: str
    dtype: torch.dtype
    learner: str = "per-trajectory"
    open_group_cap: int | None = None  # K; None = unlimited
    accumulator: str = "device"
    aux: str = "random"  # random: each of KL and entropy on in one case of three; on; off
    zero_variance: bool = False  # most groups all-equal (binary rewards all 0 or all 1)
    deterministic: bool = False  # learner.deterministic (the arrivals of ``learner``: adaptive's)
    # adaptive: early work always (the policy's decisions forced to "it pays"), never, or as measured
    drain: str = "finished-groups-first"
    pack: bool = False  # learner.pack_rows: rows packed into micro-batch lines, no padding between them
    shared_prompt: bool = False  # learner.shared_prompt_backward, on batches whose groups share prompts
    early: bool = False  # cost-aware from ``early_work_everywhere``: its rules decide, not a cold start's "never"
    lora: tuple[str, ...] | None = None  # model.lora: adapters on these modules (only they train)
    grouped: bool = True  # learner.grouped_backward (adaptive): open buckets and known rows share backwards
    idle: float = 0.4  # adaptive: the chance that the driver calls idle_work after a drain (again after each)

    def seed_key(self, seed: int, k: int) -> str:
        return f"{seed}/{self.objective}/{self.mode}/{self.std}/{self.dtype}/{self.learner}/" \
               f"{self.open_group_cap}/{self.accumulator}/{self.aux}/{self.zero_variance}/{k}" + \
               ("/deterministic" if self.deterministic else "") + \
               ("" if self.drain == "finished-groups-first" else f"/{self.drain}") + ("/packed" if self.pack else "") + \
               ("/shared-prompt" if self.shared_prompt else "") + ("/early" if self.early else "") + \
               (f"/lora={','.join(self.lora)}" if self.lora else "") + ("" if self.grouped else "/per-bucket") + \
               ("" if self.idle == 0.4 else f"/idle={self.idle}")


def zero_variance_batch(rng: random.Random) -> list[Trajectory]:
    """Group 0 with distinct rewards, then 2–4 groups whose rewards are all 0 or all 1 (A = 0)."""
    trajs = []
    for group in range(rng.randint(3, 5)):
        size = rng.randint(2, 5)
        rewards = random_rewards(rng, size, "continuous") if group == 0 else [float(rng.random() < 0.5)] * size
        for reward in rewards:
            trajs.append(random_trajectory(rng, len(trajs), group, reward))
    return trajs


def run_case(spec: CaseSpec, rng: random.Random) -> dict:
    def aux_coef() -> float:
        if spec.aux == "random":  # off in two cases of three
            return rng.choice((0.0, 0.0, rng.uniform(0.01, 0.5)))
        return rng.uniform(0.01, 0.5) if spec.aux == "on" else 0.0

    algo = AlgorithmConfig(
        objective=spec.objective, advantage=AdvantageConfig(std="none" if spec.std == "n/a" else spec.std, eps=1e-6),
        loss_agg_mode=spec.mode, loss_scale_constant=rng.choice((7.0, 256.0)), kl_coef=aux_coef(),
        entropy_coef=aux_coef(),
    )
    seed = rng.randrange(2**31)
    model = tiny_lora_llama(spec.dtype, seed, spec.lora) if spec.lora else tiny_llama(spec.dtype, seed)
    ref_model = tiny_llama(spec.dtype, rng.randrange(2**31))
    trajs = zero_variance_batch(rng) if spec.zero_variance else random_batch(rng, spec.shared_prompt)
    options = LearnerOptions(path=spec.learner, micro_batch_tokens=rng.choice((16, 48, 4096)),
                             max_open_groups=spec.open_group_cap, accumulator_device=spec.accumulator,
                             deterministic=spec.deterministic,
                             speculate_zero_variance=rng.random() < 0.5,  # either zero-variance rule
                             drain_policy=spec.drain, pack_rows=spec.pack, shared_prompt_backward=spec.shared_prompt,
                             shared_prompt_max_tokens=rng.choice((12, 32768)) if spec.shared_prompt else 32768,
                             grouped_backward=spec.grouped)
    g_stream, stats = streamed_gradient(model, ref_model, algo, trajs, rng, options,
                                        early_work_everywhere() if spec.early else None, spec.idle)
    g_ref = reference_gradient(model, trajs, algo, ref_model)
    rel = relative_error(g_stream, g_ref)
    tol = TOLERANCE[spec.dtype]
    return {
        "objective": spec.objective, "loss_agg_mode": spec.mode, "std": spec.std,
        "dtype": str(spec.dtype).removeprefix("torch."), "learner": stats["learner"],
        "open_group_cap": 0 if spec.learner == "micro-batched" or spec.deterministic else spec.open_group_cap,
        "accumulator_device": spec.accumulator, "zero_variance_groups": spec.zero_variance, "drain": spec.drain,
        "pack_rows": spec.pack, "shared_prompt": spec.shared_prompt, "lora": ",".join(spec.lora or ()),
        "early_work": spec.early,
        "open_rows": stats.get("open_rows", 0), "early_micro_batches": stats.get("early_micro_batches", 0),
        "grouped_micro_batches": stats.get("grouped_micro_batches", 0), "grouped_backward": spec.grouped,
        "shared_prompt_rows": stats.get("shared_prompt_rows", 0),
        "rel_error": rel, "tol": tol, "passed": rel <= tol, "n_traj": len(trajs),
        "micro_batch_tokens": options.micro_batch_tokens, "speculate_zero_variance": options.speculate_zero_variance,
        "micro_batches": stats["micro_batches"],
        "max_open_groups": stats["max_open_groups"], "peak_buffers": stats["peak_buffers"],
        "skipped_trajectories": stats["skipped_trajectories"],
        "speculative_trajectories": stats["speculative_trajectories"],
        "kl_coef": algo.kl_coef, "entropy_coef": algo.entropy_coef,
    }


def case_specs() -> list[CaseSpec]:
    """Conventions × every learner path, and streaming's deterministic learner; K ∈ {0, 1, 2,
    unlimited} × device/host accumulators; zero-variance groups with and without KL/entropy;
    the adaptive drain's early work forced never (closed-groups) and always (finished-groups-first,
    the default of the other cases) and as measured (cost-aware: from a cold start and from a fit
    under which its rules decide, padded and packed), K ∈ {0, 2, unlimited}; rows
    packed into micro-batch lines (micro-batched and adaptive, every convention); the shared-prompt
    backward (``shared_prompt_specs``); GRPO and OPD; float32 and float64."""
    combos = [("grpo", m, s) for m in LOSS_AGG_MODES for s in STD_MODES]
    combos += [("opd", m, "n/a") for m in OPD_LOSS_AGG_MODES]  # std does not enter OPD
    specs = []
    for dtype in (torch.float32, torch.float64):
        specs += [CaseSpec(o, m, s, dtype, learner) for o, m, s in combos for learner in LEARNER_PATHS]
        for objective, learner in (("grpo", "per-trajectory"), ("grpo", "adaptive"), ("opd", "adaptive")):
            specs += [CaseSpec(objective, "token-mean", "unbiased" if objective_of(objective).group_advantage else "n/a", dtype, learner,
                               cap, acc) for cap in (0, 1, 2, None) for acc in ("device", "host")]
        specs += [CaseSpec("grpo", "token-mean", "unbiased", dtype, learner, None, "device", aux, True)
                  for learner in LEARNER_PATHS for aux in ("off", "on")]
        specs += [CaseSpec("grpo", "token-mean", "unbiased", dtype, "adaptive", cap, "device", aux, drain=drain)
                  for drain in DRAIN_POLICIES[1:] + DRAIN_POLICIES[:1] for cap in (0, 2, None) for aux in ("off", "on")]
        specs += [CaseSpec("grpo", "token-mean", "unbiased", dtype, "adaptive", cap, "device", aux, drain="cost-aware",
                           pack=pack, early=True) for cap in (0, 2, None) for aux in ("off", "on") for pack in (False, True)]
        specs += [CaseSpec(o, m, s, dtype, learner, pack=True) for o, m, s in combos
                  for learner in ("micro-batched", "adaptive")]
        specs += [CaseSpec(o, m, s, dtype, "adaptive", deterministic=True) for o, m, s in combos]
        specs += [CaseSpec("grpo", "token-mean", "unbiased", dtype, "adaptive", None, "device", aux, True, True)
                  for aux in ("off", "on")]
        specs += shared_prompt_specs(dtype)
        specs += grouped_specs(dtype)
    return specs


def grouped_specs(dtype: torch.dtype) -> list[CaseSpec]:
    """The grouped backward (learner.grouped_backward, adaptive, GRPO: OPD has no open buckets):
    idle_work after most drains, so micro-batches mix buckets of several open groups and known rows;
    every loss mode × K ∈ {0, 2, unlimited}, KL/entropy on and off, padded and packed; the drain
    policy forced always and as measured (cost-aware from a fit under which it decides); under LoRA
    (``LORA_TARGETS`` with keys/values and with an adapter only after the last attention);
    zero-variance groups; and the per-bucket path it replaces, with the same arrivals."""
    specs = [CaseSpec("grpo", m, "unbiased", dtype, "adaptive", cap, aux=aux, pack=pack, idle=0.9)
             for i, m in enumerate(LOSS_AGG_MODES) for cap in (0, 2, None) for aux in ("off", "on")
             for pack in ((i + (cap or 0)) % 2 == 0,)]
    specs += [CaseSpec("grpo", "token-mean", "unbiased", dtype, "adaptive", cap, aux=aux, drain="cost-aware",
                       pack=True, early=True, idle=0.9) for cap in (2, None) for aux in ("off", "on")]
    specs += [CaseSpec("grpo", LOSS_AGG_MODES[j], "unbiased", dtype, "adaptive", None, aux=aux, lora=targets,
                       idle=0.9) for j, targets in enumerate(LORA_TARGETS[::2]) for aux in ("off", "on")]
    specs += [CaseSpec("grpo", "token-mean", "unbiased", dtype, "adaptive", None, aux=aux, zero_variance=True,
                       idle=0.9) for aux in ("off", "on")]
    return specs + [CaseSpec("grpo", "token-mean", "unbiased", dtype, "adaptive", cap, aux=aux, grouped=False,
                             idle=0.9) for cap in (2, None) for aux in ("off", "on")]


# LoRA targets of the shared-prompt cases: every layer's keys/values carry gradient; layer 0's
# keys and values do not (their projections frozen: no cotangent for them); none does (an adapter
# after the last attention: the prompt needs no backward at all)
LORA_TARGETS = (("q_proj", "k_proj", "v_proj", "down_proj"), ("q_proj",), ("layers.1.mlp.down_proj",))


def shared_prompt_specs(dtype: torch.dtype) -> list[CaseSpec]:
    """learner.shared_prompt_backward: every loss mode, micro-batched (sync), per-trajectory and
    adaptive with K ∈ {0, 2, unlimited}; the adaptive drain's early work also as measured
    (cost-aware) and never (closed-groups); under model.lora every path × ``LORA_TARGETS``, the
    loss modes in turn."""
    paths = [("micro-batched", None), ("per-trajectory", None), ("adaptive", 0), ("adaptive", 2), ("adaptive", None)]
    specs = [CaseSpec("grpo", m, s, dtype, learner, cap, shared_prompt=True)
             for m in LOSS_AGG_MODES for s in ("unbiased",) for learner, cap in paths]
    specs += [CaseSpec("grpo", LOSS_AGG_MODES[(i + j) % len(LOSS_AGG_MODES)], "unbiased", dtype, learner, cap,
                       aux="on" if j % 2 else "random", shared_prompt=True, lora=targets)
              for i, (learner, cap) in enumerate(paths) for j, targets in enumerate(LORA_TARGETS)]
    return specs + [CaseSpec("grpo", "token-mean", "unbiased", dtype, "adaptive", 2, "device", "on", drain=drain,
                             shared_prompt=True) for drain in DRAIN_POLICIES if drain != "finished-groups-first"]


def run_cases(seed: int = 0, cases_per_spec: int = 1, specs: list[CaseSpec] | None = None) -> list[dict]:
    """``cases_per_spec`` random batches of every spec of ``case_specs()`` (or ``specs``)."""
    return [run_case(spec, random.Random(spec.seed_key(seed, k)))
            for spec in (specs if specs is not None else case_specs()) for k in range(cases_per_spec)]


def main(json_out: bool = False) -> int:
    """Print the cases (JSON ``{"cases": [...]}`` or a table); 0 only if every case passes."""
    torch.set_num_threads(1)  # tiny models: more threads only contend (and on a shared box, badly)
    cases = run_cases()
    drafts = speculation_cases()  # keyed verification vs direct sampling (docs/speculation.md)
    if json_out:
        print(json.dumps({"cases": cases, "speculation": drafts}))
    else:
        print(f"{'objective':9} {'loss_agg_mode':24} {'std':10} {'dtype':8} {'learner':14} {'K':>4} "
              f"{'acc':6} {'rel_error':>10} {'tol':>7}  ok")
        for c in cases:
            cap = "-" if c["open_group_cap"] is None else c["open_group_cap"]
            learner = c["learner"] + ("+prompt" if c.get("shared_prompt") else "") + ("+lora" if c.get("lora") else "")
            print(
                f"{c['objective']:9} {c['loss_agg_mode']:24} {c['std']:10} {c['dtype']:8} {learner:14} "
                f"{cap:>4} {c['accumulator_device']:6} {c['rel_error']:10.2e} {c['tol']:7.0e}  "
                f"{'yes' if c['passed'] else 'NO'}"
            )
        for dtype in sorted({c["dtype"] for c in cases}):
            for objective in sorted({c["objective"] for c in cases}):
                worst = max(c["rel_error"] for c in cases if c["dtype"] == dtype and c["objective"] == objective)
                print(f"max rel_error {dtype} {objective}: {worst:.2e}")
            shared = [c["rel_error"] for c in cases if c["dtype"] == dtype and c.get("shared_prompt")]
            if shared:
                print(f"max rel_error {dtype} shared prompt: {max(shared):.2e} ({len(shared)} cases)")
            lora = [c["rel_error"] for c in cases if c["dtype"] == dtype and c.get("shared_prompt") and c.get("lora")]
            if lora:
                print(f"max rel_error {dtype} shared prompt + lora: {max(lora):.2e} ({len(lora)} cases)")
        print(f"{sum(c['passed'] for c in cases)}/{len(cases)} cases passed")
        print_cases(drafts)
    return 0 if all(c["passed"] for c in cases + drafts) else 1


if __name__ == "__main__":
    sys.exit(main(json_out="--json" in sys.argv[1:]))
