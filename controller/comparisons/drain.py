"""Streaming's drain in words (docs/pages-run.md, "The drain's decisions"): per step of a streaming
run, whether its cost-aware drain learnt before the step's last reward and, where it learnt
nothing early, why, in a sentence, from the learner's own step metrics (docs/spans.md):
``learner/early_row_share`` (the share of the step's learnt rows learnt before its last arrival),
``learner/late_close_share`` (its groups whose last reward came in the last tenth of the
rollout), ``learner/early_cost_ratio`` (an open row's seconds over a known row's, as the cost
model estimated them) and ``learner/deferred_<reason>`` (idle moments that learnt nothing, by the
rules' last refusal). A run recorded before those metrics existed is read from
``learner/early_micro_batches`` and ``learner/open_rows`` (nothing early: both 0), without a why.
"""

from __future__ import annotations

from learner.grad.batching.cost_model import DEFER_REASONS
from learner.timeline import Metric

# the rules' refusals (learner.grad.batching.cost_model.DEFER_REASONS), as a clause after "because"
REASONS = {
    "unmeasured": "no micro-batch had been measured yet (a run's first step learns the micro-batched way)",
    "cost": "an early row cost more than twice a known one, more than the tail it would save",
    "allowance": "the early rows' premium no longer fitted learner.early_work_share",
    "count": "an unfilled micro-batch would have added a backward to sync's count",
    "not_near_end": "the waiting groups were due to close before the rollout's end, so it waited for them",
    "overrun": "the work would have run past the predicted last reward, into the tail",
    "policy": "drain_policy closed-groups learns only closed groups",
}
EARLY = 0.05  # an early-row share at or below this learnt (next to) nothing early
MAX_LISTED = 6  # steps spelled out; the count covers the rest


def number(values: dict, key: str) -> float | None:
    value = values.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def step_note(step: int, values: dict) -> dict | None:
    """The step's drain decision: None where the step has no drain metric (not streaming)."""
    share = number(values, Metric.EARLY_ROW_SHARE)
    if share is None:
        early, open_rows = number(values, Metric.EARLY_MICRO_BATCHES), number(values, Metric.OPEN_ROWS)
        if early is None or open_rows is None:
            return None
        learnt_early = early > 0 or open_rows > 0
        share = None
    else:
        learnt_early = share > EARLY
    if learnt_early:
        return {"step": step, "deferred": False, "early_row_share": share, "sentence": ""}
    why = []
    late = number(values, Metric.LATE_CLOSE_SHARE)
    start, last = number(values, Metric.T_START), number(values, Metric.LAST_REWARD_T)
    if late is not None and late >= 0.5:
        tenth = f" ({1000 * 0.1 * (last - start):.0f} ms)" if start is not None and last is not None and last > start else ""
        who = "every group" if late >= 0.999 else f"{late:.0%} of its groups"
        why.append(f"{who} closed in the last tenth of the rollout{tenth}")
    counts = {r: number(values, f"{Metric.DEFERRED}{r}") or 0.0 for r in DEFER_REASONS}
    reason = max(counts, key=counts.get) if any(counts.values()) else None
    if reason is not None:
        why.append(f"{REASONS[reason]} ({counts[reason]:.0f} idle moment{'s' if counts[reason] != 1 else ''})")
    ratio = number(values, Metric.EARLY_COST_RATIO)
    cost = f"; open rows cost {ratio:.1f}x a known row here" if ratio is not None else ""
    text = f"learnt nothing early in step {step}" + (": " + "; ".join(why) if why else "") + cost
    return {"step": step, "deferred": True, "early_row_share": share, "reason": reason,
            "late_close_share": late, "early_cost_ratio": ratio, "sentence": text}


def drain_notes(rows: list[dict]) -> dict | None:
    """Per step (``rows``: the step metrics' values, each with ``step``) the drain's decision, and
    a headline; None for a run without drain metrics (not streaming)."""
    notes = [n for n in (step_note(r["step"], r) for r in rows) if n is not None]
    if not notes:
        return None
    deferred = [n for n in notes if n["deferred"]]
    shares = [n["early_row_share"] for n in notes if n["early_row_share"] is not None]
    mean = sum(shares) / len(shares) if shares else None
    learnt = f"; on average {mean:.0%} of a step's rows were learnt before its last reward" if mean is not None else ""
    headline = (f"The drain learnt early in every one of {len(notes)} steps{learnt}." if not deferred else
                f"The drain deferred all learning to the last reward in {len(deferred)} of {len(notes)} steps{learnt}.")
    return {"steps": len(notes), "deferred_steps": [n["step"] for n in deferred], "headline": headline,
            "notes": deferred[:MAX_LISTED], "more": max(len(deferred) - MAX_LISTED, 0)}
