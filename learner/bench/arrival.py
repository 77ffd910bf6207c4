"""When a step's rewards arrived, and how early a streaming learner could finish given that
(docs/learner.md, docs/bench-limits.md "The arrival bound"). Used by ``thundersync bench`` (the
``efficiency_ceiling`` of its streaming row) and ``bench/arrival_bound.py``.

A sync run's events give each trajectory's reward time (the end of its last rollout span), its
group, and whether sync back-propagated it (a zero-variance group's members have no backward
span: A = 0). ``learner_finish`` replays the step's arrivals through an idealised learner that
learns one row at a time at the sync run's own cost per row (its micro-batched backward time /
rows: no per-backward overhead, no padding), always busy when a row it may learn is waiting:

  - rows of closed groups (advantage known) first,
  - then rows of groups holding running sums,
  - then a new group takes sums, the one with most rows waiting, while fewer than K hold them
    (``learner.max_open_groups``; a group holds its sums until it closes).

Its finish is a lower bound on the backward work of any drain policy of that K when an open row
costs what a known one does; rows of a group without sums become learnable only when its last
member arrives.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass

from learner.bench.measure import measured_steps


@dataclass
class StepArrivals:
    step: int
    t_start: float
    last_reward: float
    arrival: dict[int, float]  # trajectory -> reward time
    group: dict[int, int]  # trajectory -> group
    learnt: set[int]  # trajectories with a backward in the sync run
    row_s: float  # the sync run's backward time per learnt row


def step_arrivals(events: list[dict]) -> list[StepArrivals]:
    spans = [e for e in events if e.get("type") == "span" and e.get("traj") is not None]
    out = []
    for m in (e for e in events if e.get("type") == "metrics"):
        arrival: dict[int, float] = defaultdict(float)
        group, backward = {}, defaultdict(float)
        for s in (s for s in spans if s["step"] == m["step"]):
            if s["lane"].startswith("rollout"):
                arrival[s["traj"]] = max(arrival[s["traj"]], s["t1"])
                group[s["traj"]] = s["group"]
            elif s["kind"] == "learner.backward":
                backward[s["traj"]] += s["t1"] - s["t0"]
        v = m["values"]
        out.append(StepArrivals(m["step"], v["step/t_start"], v["step/last_reward_t"], dict(arrival), group,
                                set(backward), sum(backward.values()) / max(len(backward), 1)))
    return out


def learner_finish(s: StepArrivals, cap: int | None, open_cost: float = 1.0, open_until: float | None = None) -> float:
    """Earliest end of the step's backward work (seconds from the step's start) under K = ``cap``.

    ``open_cost``: what a row learnt into running sums (its group not closed yet) costs, in rows
    of the known-advantage path (with a KL term the open row's two cotangents cost ~2.2×,
    ``bench/decisions/learner_paths.py``); ``open_until``: open rows are learnt only before this time
    (seconds from the step's start; later, rows wait for their close)."""
    close: dict[int, float] = defaultdict(float)
    for traj, g in s.group.items():
        close[g] = max(close[g], s.arrival[traj])
    rows = sorted(s.learnt, key=lambda t: s.arrival[t])
    now, done, sums = min(s.arrival.values()), set(), set()
    while len(done) < len(rows):
        sums = {g for g in sums if close[g] > now}  # a closed group's sums are folded: its buffer is free
        waiting = [t for t in rows if t not in done and s.arrival[t] <= now]
        known = [t for t in waiting if close[s.group[t]] <= now]
        may_open = open_until is None or now - s.t_start < open_until
        pick = known or ([t for t in waiting if s.group[t] in sums] if may_open else [])
        if not pick and may_open and (cap is None or len(sums) < cap) and waiting:
            count: dict[int, int] = defaultdict(int)
            for t in waiting:
                count[s.group[t]] += 1
            g = max(count, key=count.get)
            sums.add(g)
            pick = [t for t in waiting if s.group[t] == g]
        if pick:
            done.add(pick[0])
            now += s.row_s * (1.0 if known else open_cost)
        else:  # nothing learnable: wait for the next arrival or close
            now = min([s.arrival[t] for t in rows if t not in done and s.arrival[t] > now]
                      + [close[s.group[t]] for t in waiting if close[s.group[t]] > now])
    return now - s.t_start


def best_with_open_cost(s: StepArrivals, open_cost: float, cap: int | None = None) -> tuple[float, str]:
    """With open rows dearer than known ones, being always busy is no longer best: the earliest
    finish over a family of policies (K in 0, 1, 2, 4, 8, unlimited, none above ``cap``; open rows
    only before 0, 0.1, ..., 1.0 R or always), and which one gave it. The best of a family, not a
    proof over all policies."""
    rollout_s = s.last_reward - s.t_start
    caps = [k for k in (0, 1, 2, 4, 8, None) if cap is None or (k is not None and k < cap)]
    caps += [] if cap is None else [cap]
    best = (float("inf"), "")
    for k in caps:
        for until in [None] + [i / 10 for i in range(11)]:
            f = learner_finish(s, k, open_cost, None if until is None else until * rollout_s)
            if f < best[0]:
                best = (f, f"K={'unlimited' if k is None else k}, open rows "
                           f"{'always' if until is None else f'before {until:.1f} R'}")
    return best


def bounds(events: list[dict], caps: list[int | None], balance: float | None = None,
           open_cost: float = 1.0) -> list[dict]:
    """Per step: R (last reward), the backward work (the sync run's, or ``balance``·R), and the
    learner's earliest finish per K (open rows at ``open_cost``; above 1 also the best policy of
    ``best_with_open_cost``)."""
    out = []
    for s in step_arrivals(events):
        rollout_s = s.last_reward - s.t_start
        if balance is not None and s.learnt:
            s.row_s = balance * rollout_s / len(s.learnt)
        finish = {("unlimited" if k is None else f"K={k}"): learner_finish(s, k, open_cost) for k in caps}
        row = {"step": s.step, "rollout_s": rollout_s, "backward_s": s.row_s * len(s.learnt), "rows": len(s.learnt),
               "finish_s": finish}
        if open_cost != 1.0:
            finish["best"], row["best_policy"] = best_with_open_cost(s, open_cost)
        out.append(row)
    return out


def streaming_ceiling(sync_runs: list[list[dict]], streaming_runs: list[list[dict]], warmup: int, end: int,
                      cap: int | None, bound_s: float) -> dict:
    """What the sync runs' arrival times leave a streaming learner of K = ``cap``: the median over
    the measured steps (``warmup`` .. ``end`` − 1) of the earliest end of its backward work
    (``arrival_bound_s``), and ``bound_s`` over it, at most 1 (``efficiency_ceiling``): the
    efficiency no drain policy reaches, before the optimizer and the publish. An open-group row
    costs what the streaming runs measured (``learner/open_row_cost``, median over their measured
    steps: with a KL or entropy term it needs two cotangents); at most 1 counts as 1, and above it
    the best of ``best_with_open_cost``'s policies is taken."""
    costs = [v["learner/open_row_cost"] for events in streaming_runs for v in measured_steps(events, warmup, end)
             if "learner/open_row_cost" in v]
    measured = statistics.median(costs) if costs else None
    open_cost = max(1.0, measured) if measured is not None else 1.0
    finishes = [learner_finish(s, cap) if open_cost == 1.0 else best_with_open_cost(s, open_cost, cap)[0]
                for events in sync_runs for s in step_arrivals(events) if warmup <= s.step < end and s.learnt]
    if not finishes:
        return {}
    finish = statistics.median(finishes)
    return {"arrival_bound_s": finish, "efficiency_ceiling": min(1.0, bound_s / finish),
            "open_row_cost": measured}

