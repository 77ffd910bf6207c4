"""How drafts are scheduled and verified in a worker (docs/speculation.md, "Priority"): the online
cost model of the engine's forwards, the rule that a draft forward must end before the next
current loop is due, verification chunks that never split a GRPO group, and the kept-token
share by how far ahead a draft was started."""

from __future__ import annotations

from types import SimpleNamespace

from learner.driver.speculation_metrics import by_distance
from learner.rollout.speculation import drafts
from learner.rollout.engine.step_cost import MIN_SAMPLES, CostLine, StepCost
from learner.rollout.speculation.turns import LoopState
from learner.timeline import Metric
from learner.trajectory import Trajectory


def test_cost_line_recovers_a_line_and_follows_a_change() -> None:
    line = CostLine()
    assert line.predict(10) is None
    for rows in [1, 8, 64, 256] * 5:
        line.add(rows, 0.0013 + 0.00002 * rows)
    assert abs(line.predict(128) - (0.0013 + 0.00002 * 128)) < 1e-9
    for rows in [1, 8, 64, 256] * 60:  # the machine got twice as slow: the fit follows it
        line.add(rows, 2 * (0.0013 + 0.00002 * rows))
    assert abs(line.predict(128) / (2 * (0.0013 + 0.00002 * 128)) - 1) < 0.05


def test_one_size_seen_predicts_proportionally() -> None:
    line = CostLine()
    for _ in range(MIN_SAMPLES):
        line.add(32, 0.004)
    assert line.predict(32) == 0.004 and line.predict(8) == 0.001


def loop(traj: int, group: int, *, draft: bool, ready_at: float = 0.0, parked=None, ids=10, step=1) -> LoopState:
    return LoopState(traj, group, step, None, traj, traj, [1] * ids, [0] * ids, [0.0] * ids,
                     ready_at=ready_at, draft=draft, parked=parked)


def host(loops: list[LoopState], now: float, cost: StepCost) -> SimpleNamespace:
    cfg = SimpleNamespace(rollout=SimpleNamespace(speculation=SimpleNamespace(draft_token_budget=10_000)))
    return SimpleNamespace(cfg=cfg, loops={lp.traj: lp for lp in loops}, engine=SimpleNamespace(step_cost=cost),
                           now=lambda: now, commands_waiting=lambda: False, drafts_held=False,
                           unverified=[], verifying=set())


def warm_cost() -> StepCost:
    cost = StepCost()
    for rows in [1, 16, 64, 256] * 3:
        cost.decode.add(rows, 0.0013 + 0.00002 * rows)
        cost.prefill.add(rows * 20, 0.0015 + 0.000005 * rows * 20)
    return cost


def test_drafts_run_only_where_their_forward_ends_before_a_current_loop_is_due() -> None:
    cost, waiting = warm_cost(), [loop(t, t // 8, draft=True) for t in range(64)]
    far = host([loop(999, 99, draft=False, ready_at=1.0)] + waiting, now=0.0, cost=cost)
    assert len(drafts.pick(far, lambda lps: lps)) == 64  # a second away: all of them
    near = host([loop(999, 99, draft=False, ready_at=0.006)] + waiting, now=0.0, cost=cost)
    few = drafts.pick(near, lambda lps: lps)
    assert 0 < len(few) < 64  # 6 ms away: as many as whose prefill + decode step fit
    t = 0.006 - drafts.SLACK_S
    assert (cost.call(len(few), len(few), 10) * drafts.SAFETY <= t < cost.call(2 * len(few), 2 * len(few), 10)
            * drafts.SAFETY)
    due = host([loop(999, 99, draft=False, ready_at=0.001)] + waiting, now=0.0, cost=cost)
    assert drafts.pick(due, lambda lps: lps) == [] and drafts.runnable_due(due) == []
    assert drafts.step_fits(far, 256) and not drafts.step_fits(due, 1)
    ready = host([loop(999, 99, draft=False, ready_at=0.0)] + waiting, now=0.0, cost=cost)
    assert drafts.pick(ready, lambda lps: lps) == []


def test_idle_engine_drafts_within_the_idle_step() -> None:
    cold = host([loop(t, 0, draft=True) for t in range(8)], now=0.0, cost=StepCost())
    assert len(drafts.pick(cold, lambda lps: lps)) == 8  # nothing measured yet, nothing waits: it learns here
    cold.loops[999] = loop(999, 99, draft=False, ready_at=1.0)
    assert drafts.pick(cold, lambda lps: lps) == []  # ... but never while a current loop is in flight
    warm = host([loop(t, t // 8, draft=True) for t in range(256)], now=0.0, cost=warm_cost())
    n = len(drafts.pick(warm, lambda lps: lps))
    assert 1 < n < 256 and warm_cost().call(n, n, 10) * drafts.SAFETY + drafts.SLACK_S <= drafts.IDLE_STEP_S
    warm.drafts_held = True  # a Load came: its Work is next
    assert drafts.pick(warm, lambda lps: lps) == [] and drafts.runnable_due(warm) == []


def test_verification_chunks_keep_groups_whole_fewest_finished_first() -> None:
    finished = [loop(t, 0, draft=True, parked=True) for t in range(8)]
    mixed = [loop(8 + t, 1, draft=True, parked=True if t % 2 else None) for t in range(8)]
    open_ = [loop(16 + t, 2, draft=True) for t in range(5)]  # a group of which 5 drafts were started
    big = [loop(30 + t, 3, draft=True) for t in range(40)]  # larger than a chunk: a chunk of its own
    chunks = drafts.verify_chunks(finished + mixed + big + open_)
    # none finished (groups 2, 3), half (1), all (0); at most VERIFY_CHUNK a chunk unless one group is larger
    assert [[lp.group for lp in c] for c in chunks] == [[2] * 5, [3] * 40, [1] * 8 + [0] * 8]


def test_kept_share_by_how_far_ahead_the_draft_started() -> None:
    def traj(step: int, versions: list[int], drafted: int, kept: int) -> Trajectory:
        return Trajectory(0, 0, step, [1], [1], [0.0], drafted_versions=versions, drafted_tokens=drafted,
                          kept_tokens=kept)

    out = by_distance([traj(5, [4, 4], 20, 20), traj(5, [4, -1], 10, 5), traj(5, [3, 4], 30, 15)])
    assert out[Metric.DRAFTED_AHEAD + "1"] == 30 and out[Metric.KEPT_SHARE_AHEAD + "1"] == 25 / 30
    assert out[Metric.DRAFTED_AHEAD + "2plus"] == 30 and out[Metric.KEPT_SHARE_AHEAD + "2plus"] == 0.5
