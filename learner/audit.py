"""Independent audit of one dumped learner step (``thundersync train --dump-step DIR``).

DIR layout (the trainer dumps step ``--dump-at``, default 0; a step's pre-step policy is
the frozen KL reference only at step 0, so a later step with KL also gets ``ref_model/``):

    model/       HF directory of the pre-step policy (AutoModelForCausalLM.from_pretrained)
    ref_model/   the frozen KL reference, when it differs from model/
    batch.json   {"objective": "grpo"|"opd", "advantage": {"std", "eps"}, "loss_agg_mode",
                  "loss_scale_constant", "kl_coef", "entropy_coef",
                  "off_policy": bool, "clip_ratio", "schedule", "step", "trained_version",
                  "group_size", "sampling": {"temperature", "top_p"},
                  "trajectories": [{"id", "group", "reward", "input_ids", "loss_mask",
                                    "behavior_logprobs": per position (0 where unscored),
                                    "turn_versions", "turn_spans": [[start, end), ...],
                                    "teacher_logprobs": per position (null where unscored) | null}]}
    grad.pt      {param name: tensor} the learner's final gradient before clipping, in the
                 model's dtype

``audit_dump`` recomputes the step's gradient from batch.json with its own code — one
padded forward, one loss over the batch, one backward, torch's mean/std for the group
statistics; for an off-policy step the clipped objective against the dumped behaviour
log-probs (docs/math.md) — and deliberately not through ``learner.grad.objectives``, so a bug
there shows up as a mismatch instead of being repeated on both sides.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from learner.config import LOSS_AGG_MODES, STD_MODES, AlgorithmConfig
from learner.models.loading import widen_norms
from learner.trajectory import Trajectory
from learner.registries.objectives import OBJECTIVES
from learner.registries.objectives import objective as objective_of

# The trainer's gradient carries its own rounding (summation order), so the audit tolerances
# sit above docs/math.md's streaming-vs-reference ones but far below any real error (a wrong
# advantage or normaliser is O(1/B)). A float64 model is float64 throughout on both sides
# (``widen_norms``), hence 1e-12 there.
AUDIT_TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 5e-2, torch.float16: 5e-2}


class AuditError(ValueError):
    """A dump that cannot be audited; the message names the file, field and reason."""


def write_dump(
    dir: str | Path,
    model: torch.nn.Module,
    tokenizer: Any,
    trajs: list[Trajectory],
    algo: AlgorithmConfig,
    grads: dict[str, torch.Tensor],
    ref_model: torch.nn.Module | None = None,
    step: dict[str, Any] | None = None,
) -> Path:
    """Write model/, batch.json and grad.pt (see the module docstring); returns DIR.
    ``step``: how the step was made (schedule, step, trained_version, group_size, sampling,
    off_policy, clip_ratio), recorded in batch.json."""
    out = Path(dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out / "model")
    if tokenizer is not None:
        tokenizer.save_pretrained(out / "model")
    if ref_model is not None and algo.kl_coef > 0:
        ref_model.save_pretrained(out / "ref_model")
    batch = {
        "objective": algo.objective,
        "advantage": {"std": algo.advantage.std, "eps": algo.advantage.eps},
        "loss_agg_mode": algo.loss_agg_mode,
        "loss_scale_constant": algo.loss_scale_constant,
        "kl_coef": algo.kl_coef,
        "entropy_coef": algo.entropy_coef,
        "clip_ratio": algo.clip_ratio,
        "off_policy": False,
        **(step or {}),
        "trajectories": [
            {"id": t.id, "group": t.group, "reward": t.reward, "input_ids": list(t.input_ids),
             "loss_mask": list(t.loss_mask), "behavior_logprobs": list(t.behavior_logprobs),
             "turn_versions": list(t.turn_versions), "turn_spans": [list(s) for s in t.turn_spans],
             "teacher_logprobs": t.teacher_logprobs}
            for t in trajs
        ],
    }
    (out / "batch.json").write_text(json.dumps(batch))
    torch.save({name: g.detach().cpu() for name, g in grads.items()}, out / "grad.pt")
    return out


def _field(obj: dict, key: str, where: str, kinds: tuple[type, ...]) -> Any:
    if key not in obj:
        raise AuditError(f"batch.json: {where}{key} is missing")
    value = obj[key]
    if not isinstance(value, kinds) or isinstance(value, bool) and bool not in kinds:
        raise AuditError(f"batch.json: {where}{key} has type {type(value).__name__}")
    return value


def load_batch(path: Path) -> dict:
    """batch.json, validated: every error names the field."""
    try:
        batch = json.loads(path.read_text())
    except OSError as err:
        raise AuditError(f"batch.json: cannot read {path}: {err.strerror}") from None
    except json.JSONDecodeError as err:
        raise AuditError(f"batch.json: not valid JSON: {err}") from None
    if _field(batch, "objective", "", (str,)) not in OBJECTIVES:
        raise AuditError(f"batch.json: objective must be grpo or opd, got {batch['objective']!r}")
    if _field(batch, "loss_agg_mode", "", (str,)) not in LOSS_AGG_MODES:
        raise AuditError(f"batch.json: loss_agg_mode {batch['loss_agg_mode']!r} is not one of {LOSS_AGG_MODES}")
    adv = _field(batch, "advantage", "", (dict,))
    if _field(adv, "std", "advantage.", (str,)) not in STD_MODES:
        raise AuditError(f"batch.json: advantage.std {adv['std']!r} is not one of {STD_MODES}")
    _field(adv, "eps", "advantage.", (int, float))
    for key in ("loss_scale_constant", "kl_coef", "entropy_coef"):
        _field(batch, key, "", (int, float))
    off_policy = bool(batch.get("off_policy", False))
    if off_policy:
        _field(batch, "clip_ratio", "", (int, float))
    trajs = _field(batch, "trajectories", "", (list,))
    if not trajs:
        raise AuditError("batch.json: trajectories is empty")
    for i, t in enumerate(trajs):
        where = f"trajectories[{i}]."
        ids = _field(t, "input_ids", where, (list,))
        mask = _field(t, "loss_mask", where, (list,))
        _field(t, "reward", where, (int, float))
        _field(t, "group", where, (int,))
        if not ids or len(mask) != len(ids) or any(m not in (0, 1) for m in mask) or mask[0]:
            raise AuditError(f"batch.json: {where}loss_mask must be 0/1, one per input id, 0 at position 0")
        if off_policy:
            behavior = _field(t, "behavior_logprobs", where, (list,))
            if len(behavior) != len(ids) or any(not isinstance(v, (int, float)) for v in behavior):
                raise AuditError(f"batch.json: {where}behavior_logprobs needs a number at every position")
        if objective_of(batch["objective"]).teacher_scored:
            teacher = _field(t, "teacher_logprobs", where, (list,))
            if len(teacher) != len(ids) or any(m and not isinstance(v, (int, float)) for m, v in zip(mask, teacher)):
                raise AuditError(f"batch.json: {where}teacher_logprobs needs a number at every scored position")
    return batch


def _logprobs(model: torch.nn.Module, ids: torch.Tensor, wide: torch.dtype, with_entropy: bool):
    """Log-probs of tokens 1..T−1 (B, T−1) and optionally the entropies of their distributions."""
    logits = model(input_ids=ids).logits[:, :-1].to(wide)  # (B, T−1, V)
    log_p = torch.log_softmax(logits, -1)
    chosen = log_p.gather(-1, ids[:, 1:, None])[..., 0]  # (B, T−1)
    entropy = -(log_p.exp() * log_p).sum(-1) if with_entropy else None
    return chosen, entropy


def _group_advantages(rewards: torch.Tensor, groups: list[int], std: str, eps: float) -> torch.Tensor:
    """A_i = (r_i − mean_k)/(std_k + eps) per group (torch's mean/std); group of one → 0."""
    adv = torch.zeros_like(rewards)
    for g in set(groups):
        idx = torch.tensor([i for i, gi in enumerate(groups) if gi == g])
        r = rewards[idx]
        centred = r - r.mean()
        if std == "none":
            adv[idx] = centred
            continue
        sigma = r.std(correction=1) if std == "unbiased" and len(r) > 1 else r.std(correction=0)
        denom = sigma + eps
        adv[idx] = centred / denom if denom > 0 else torch.zeros_like(r)
    return adv


def _positions(trajs: list[dict], key: str, shape: tuple[int, int], wide: torch.dtype) -> torch.Tensor:
    """(B, T) per-position values of ``key``, 0 where the token is not scored (or padding)."""
    out = torch.zeros(shape, dtype=wide)
    for i, t in enumerate(trajs):
        out[i, : len(t[key])] = torch.tensor([v if m else 0.0 for v, m in zip(t[key], t["loss_mask"])], dtype=wide)
    return out


def _policy_terms(batch: dict, logp: torch.Tensor, mask: torch.Tensor, stats: dict) -> torch.Tensor:
    """Per-token policy loss (B, T−1) of docs/math.md: on-policy −A·ρ with ρ ≡ 1 in value;
    off-policy −min(ρA, clip(ρ, 1−c, 1+c)A) with ρ against the dumped behaviour log-probs."""
    trajs, wide = batch["trajectories"], logp.dtype
    shape = (len(trajs), max(len(t["input_ids"]) for t in trajs))
    if objective_of(batch["objective"]).group_advantage:
        # float64 whatever the model: rewards like 100 + noise lose their noise in float32
        rewards = torch.tensor([float(t["reward"]) for t in trajs], dtype=torch.float64)
        adv = _group_advantages(rewards, [t["group"] for t in trajs], batch["advantage"]["std"],
                                batch["advantage"]["eps"]).to(wide)[:, None]  # (B, 1)
    if not batch.get("off_policy"):
        ratio = torch.exp(logp - logp.detach())  # 1 in value; ∇ = ∇log π_θ
        if objective_of(batch["objective"]).group_advantage:
            return -adv * ratio
        return (logp.detach() - _positions(trajs, "teacher_logprobs", shape, wide)[:, 1:]) * ratio
    behavior = _positions(trajs, "behavior_logprobs", shape, wide)[:, 1:]  # (B, T−1)
    if objective_of(batch["objective"]).teacher_scored:
        adv = _positions(trajs, "teacher_logprobs", shape, wide)[:, 1:] - behavior
    log_ratio = torch.where(mask > 0, logp - behavior, torch.zeros_like(logp))
    rho, c = torch.exp(log_ratio), float(batch["clip_ratio"])
    scored = mask > 0
    stats["clip_frac"] = float(((rho < 1 - c) | (rho > 1 + c))[scored].double().mean()) if scored.any() else 0.0
    stats["max_abs_log_ratio"] = float(log_ratio.detach().abs().max())
    return -torch.minimum(rho * adv, rho.clamp(1 - c, 1 + c) * adv)


def recompute_gradient(model: torch.nn.Module, ref_model: torch.nn.Module, batch: dict,
                       stats: dict | None = None) -> dict[str, torch.Tensor]:
    """∇ of normaliser · Σ_i Σ_t w_{i,t} (ℓ_{i,t} + kl_coef·k3 − entropy_coef·H) over the whole
    batch (docs/math.md); an off-policy step's clip statistics go into ``stats``."""
    trajs, mode = batch["trajectories"], batch["loss_agg_mode"]
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    wide = torch.float64 if named[0][1].dtype == torch.float64 else torch.float32
    B, T = len(trajs), max(len(t["input_ids"]) for t in trajs)
    ids = torch.zeros(B, T, dtype=torch.long)
    mask = torch.zeros(B, T, dtype=wide)
    for i, t in enumerate(trajs):
        ids[i, : len(t["input_ids"])] = torch.tensor(t["input_ids"])
        mask[i, : len(t["loss_mask"])] = torch.tensor(t["loss_mask"], dtype=wide)
    mask = mask[:, 1:]  # (B, T−1): aligned with the predicted tokens 1..T−1

    logp, entropy = _logprobs(model, ids, wide, batch["entropy_coef"] > 0)
    per_token = _policy_terms(batch, logp, mask, {} if stats is None else stats)
    if batch["kl_coef"] > 0:
        with torch.no_grad():
            ref_logp, _ = _logprobs(ref_model, ids, wide, False)
        per_token = per_token + batch["kl_coef"] * (torch.exp(ref_logp - logp) - (ref_logp - logp) - 1)
    if batch["entropy_coef"] > 0:
        per_token = per_token - batch["entropy_coef"] * entropy

    lengths = mask.sum(1, keepdim=True)  # (B, 1) = |o_i|
    weights = mask / lengths.clamp(min=1) if mode == "seq-mean-token-mean" else mask
    normaliser = {
        "token-mean": 1.0 / max(float(mask.sum()), 1.0),
        "seq-mean-token-mean": 1.0 / B,
        "seq-mean-token-sum": 1.0 / B,
        "seq-mean-token-sum-norm": 1.0 / float(batch["loss_scale_constant"]),
    }[mode]
    loss = normaliser * (weights * per_token).sum()
    grads = torch.autograd.grad(loss, [p for _, p in named], allow_unused=True)
    return {n: (torch.zeros_like(p) if g is None else g) for (n, p), g in zip(named, grads)}


def _load_policy(path: Path) -> torch.nn.Module:
    """The dumped pre-step policy; a LoRA policy's dump is its adapter, applied to the base
    model it names (``adapter_config.json``), with the adapter trainable as in the run."""
    if (path / "adapter_config.json").exists():
        from peft import AutoPeftModelForCausalLM

        return AutoPeftModelForCausalLM.from_pretrained(str(path), is_trainable=True, local_files_only=True).eval()
    # in its own dtype; a float64 one float64 throughout, as the trainer's
    return widen_norms(AutoModelForCausalLM.from_pretrained(str(path), dtype="auto", local_files_only=True)).eval()


def audit_dump(dir: str | Path) -> dict:
    """Recompute DIR's gradient independently and compare: {rel_error, max_abs, passed, n_traj, tol}."""
    root = Path(dir)
    for name in ("model", "batch.json", "grad.pt"):
        if not (root / name).exists():
            raise AuditError(f"{root / name}: missing from the dump")
    batch = load_batch(root / "batch.json")
    model = _load_policy(root / "model")
    ref_model = _load_policy(root / "ref_model") if (root / "ref_model").exists() else model
    dumped = torch.load(root / "grad.pt", map_location="cpu", weights_only=True)
    stats: dict[str, float] = {}
    recomputed = recompute_gradient(model, ref_model, batch, stats)
    missing, extra = set(recomputed) - set(dumped), set(dumped) - set(recomputed)
    if missing or extra:
        raise AuditError(f"grad.pt: parameter names differ from the model (missing {sorted(missing)}, extra {sorted(extra)})")
    diff_sq = ref_sq = 0.0
    max_abs = 0.0
    for name, ref in recomputed.items():
        delta = dumped[name].double() - ref.double()
        diff_sq += float(delta.square().sum())
        ref_sq += float(ref.double().square().sum())
        max_abs = max(max_abs, float(delta.abs().max()))
    rel = math.sqrt(diff_sq / ref_sq) if ref_sq > 0 else (0.0 if diff_sq == 0 else math.inf)
    tol = AUDIT_TOLERANCE.get(next(model.parameters()).dtype, 1e-5)
    return {"rel_error": rel, "max_abs": max_abs, "passed": rel <= tol, "n_traj": len(batch["trajectories"]), "tol": tol,
            "off_policy": bool(batch.get("off_policy")), **stats}

