"""The arrival bound (learner/bench/arrival.py, ``python -m bench.arrival_bound``): the earliest a
learner of cap K can finish, replayed from recorded arrivals."""

import json
import os
import subprocess
import sys
from pathlib import Path

from learner.bench.arrival import bounds

ROOT = Path(__file__).resolve().parents[2]


def sync_events(arrivals: dict[int, tuple[int, float]], learnt: set[int], row_s: float) -> list[dict]:
    """A one-step sync recording: each trajectory's last rollout span ends at its arrival; the
    learnt ones have a backward of ``row_s`` after the last reward."""
    last = max(t for _, t in arrivals.values())
    events = [{"type": "span", "step": 0, "kind": "rollout.verify", "lane": f"rollout/0/{traj}", "traj": traj,
               "group": g, "t0": t - 0.01, "t1": t} for traj, (g, t) in arrivals.items()]
    events += [{"type": "span", "step": 0, "kind": "learner.backward", "lane": "learner/0", "traj": traj,
                "group": arrivals[traj][0], "t0": last + k * row_s, "t1": last + (k + 1) * row_s}
               for k, traj in enumerate(sorted(learnt))]
    events.append({"type": "metrics", "step": 0, "values": {"step/t_start": 0.0, "step/last_reward_t": last}})
    return events


def test_a_group_without_sums_is_learnt_only_after_its_last_member_arrives():
    # group 0 arrives at 0.1 and 0.2, group 1 at 0.15 and 1.0; 0.1 s per row
    events = sync_events({0: (0, 0.1), 1: (0, 0.2), 2: (1, 0.15), 3: (1, 1.0)}, {0, 1, 2, 3}, 0.1)
    [step] = bounds(events, [None, 0, 1])
    assert step["rows"] == 4 and abs(step["backward_s"] - 0.4) < 1e-9 and step["rollout_s"] == 1.0
    finish = step["finish_s"]
    # unlimited and K = 1: rows 0, 1, 2 learnt before 1.0 (group 0's sums are freed at its close), row 3 after
    assert abs(finish["unlimited"] - 1.1) < 1e-9 and abs(finish["K=1"] - 1.1) < 1e-9
    # K = 0: group 1's first member waits for its close at 1.0, behind it the last one
    assert abs(finish["K=0"] - 1.2) < 1e-9


def test_zero_variance_members_cost_nothing_and_balance_rescales_the_work_to_r():
    events = sync_events({0: (0, 0.5), 1: (0, 0.5), 2: (1, 0.2), 3: (1, 1.0)}, {0, 1}, 0.05)  # group 1: A = 0
    [step] = bounds(events, [None], balance=1.0)
    assert step["rows"] == 2 and abs(step["backward_s"] - 1.0) < 1e-9
    # two rows of 0.5 s each from 0.5 on: the learner ends at 1.5 = 1.5 R however early it starts
    assert abs(step["finish_s"]["unlimited"] - 1.5) < 1e-9


def test_open_rows_at_their_cost_and_the_best_policy_that_waits_for_the_close():
    # the same arrivals as the first test; an open row costs 3 known rows
    events = sync_events({0: (0, 0.1), 1: (0, 0.2), 2: (1, 0.15), 3: (1, 1.0)}, {0, 1, 2, 3}, 0.1)
    [step] = bounds(events, [None, 0], open_cost=3.0)
    finish = step["finish_s"]
    # always busy: row 0 (open, 0.1 -> 0.4), row 1 (group 0 closed at 0.2: known, -> 0.5), row 2
    # (open, -> 0.8), then row 3 at 1.0 (known) -> 1.1
    assert abs(finish["unlimited"] - 1.1) < 1e-9
    # K = 0 learns every row known: 0 and 1 after 0.2, 2 and 3 after 1.0 -> 1.2
    assert abs(finish["K=0"] - 1.2) < 1e-9
    assert abs(finish["best"] - 1.1) < 1e-9 and "K=" in step["best_policy"]
    # an open row dearer still: waiting for the close wins, and the best policy says so
    [step] = bounds(events, [None], open_cost=8.0)
    assert step["finish_s"]["unlimited"] > 1.2 + 1e-9 and abs(step["finish_s"]["best"] - 1.2) < 1e-9


def test_the_script_runs_as_a_module_from_the_repository_root(tmp_path):
    events = sync_events({0: (0, 0.1), 1: (0, 0.2), 2: (1, 0.15), 3: (1, 1.0)}, {0, 1, 2, 3}, 0.1)
    path = tmp_path / "sync.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the package needs no path of its own
    proc = subprocess.run([sys.executable, "-m", "bench.arrival_bound", str(path), "--caps", "none,0"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("step 0: R 1.00 s, backward 0.40 s (4 rows)")
    assert "unlimited 1.10 (1.10 R)" in proc.stdout and "K=0 1.20 (1.20 R)" in proc.stdout
