"""Per-step metrics of cross-iteration speculation and of the engines' busy time
(docs/speculation.md, docs/spans.md): pure functions of the step's trajectories and spans."""

from __future__ import annotations

from learner.timeline import Kind, Metric, _get, union_length
from learner.trajectory import Trajectory

# what keeps a worker's core busy: its engine's calls (drafts and their verification included), the teacher
ENGINE_KINDS = (Kind.GENERATE, Kind.DRAFT, Kind.DRAFT_VERIFY, Kind.TEACHER)


def busy_share(spans: list, t_start: float, t_end: float, workers: int) -> float:
    """rollouter/busy_share: Σ over workers of the time its engine was busy, over window × workers."""
    per_worker: dict[str, list[tuple[float, float]]] = {}
    for s in spans:
        lane = _get(s, "lane")
        if _get(s, "kind") in ENGINE_KINDS and lane.startswith("rollout/"):
            per_worker.setdefault(lane.split("/")[1], []).append((_get(s, "t0"), _get(s, "t1")))
    busy = sum(union_length(iv, t_start, t_end) for iv in per_worker.values())
    return busy / max((t_end - t_start) * max(workers, 1), 1e-12)


def speculation_metrics(trajs: list[Trajectory], spans: list, t_start: float, t_end: float) -> dict[str, float]:
    """speculation/*: of the step's trajectories that were drafted, the drafted tokens, the share
    kept by verification, the share kept whole, the tokens sampled after it, the context tokens
    whose keys/values those remainders took from verification instead of prefilling them again;
    and the seconds of verification forwards in the step's window (one forward covers many
    drafts: their union)."""
    drafted = [t for t in trajs if t.drafted_tokens]
    tokens = sum(t.drafted_tokens for t in drafted)
    verify = [(_get(s, "t0"), _get(s, "t1")) for s in spans if _get(s, "kind") == Kind.DRAFT_VERIFY]
    return by_distance(drafted) | {
        Metric.DRAFTED_TOKENS: float(tokens),
        Metric.KEPT_TOKEN_SHARE: sum(t.kept_tokens for t in drafted) / tokens if tokens else 0.0,
        Metric.WHOLE_DRAFT_SHARE: sum(t.kept_tokens == t.drafted_tokens for t in drafted) / len(drafted)
        if drafted else 0.0,
        Metric.VERIFY_S: union_length(verify, t_start, t_end),
        Metric.REMAINDER_TOKENS: float(sum(t.n_scored - t.kept_tokens for t in drafted)),
        Metric.VERIFIED_KV_TOKENS: float(sum(t.verified_kv_tokens for t in drafted)),
    }


def ahead(t: Trajectory) -> int:
    """How many steps ahead the draft was started: its step less the version that drafted its first turn."""
    return t.step - min(v for v in t.drafted_versions if v >= 0) if any(v >= 0 for v in t.drafted_versions) else 1


def by_distance(drafted: list[Trajectory]) -> dict[str, float]:
    """The kept-token share of the drafts started 1 step ahead (``..._1``) and of those started 2+
    steps ahead (``..._2plus``, ``rollout.speculation.lookahead`` > 1), with their drafted tokens,
    where there are any."""
    out: dict[str, float] = {}
    for name, group in (("1", [t for t in drafted if ahead(t) <= 1]), ("2plus", [t for t in drafted if ahead(t) > 1])):
        tokens = sum(t.drafted_tokens for t in group)
        if tokens:
            out[Metric.DRAFTED_AHEAD + name] = float(tokens)
            out[Metric.KEPT_SHARE_AHEAD + name] = sum(t.kept_tokens for t in group) / tokens
    return out
