"""Bootstrap intervals of the bench's medians and speedups, and the README table made from a bench JSON."""

from __future__ import annotations

import json
import statistics

import pytest

from bench import headline
from learner.bench.intervals import median_interval, ratio_interval, spans_one


def test_the_median_interval_holds_the_median_and_narrows_with_more_steps():
    few = [1.0, 1.2, 0.9, 1.1, 1.3]
    many = few * 8
    lo, hi = median_interval(few)
    assert lo <= statistics.median(few) <= hi
    lo8, hi8 = median_interval(many)
    assert hi8 - lo8 < hi - lo
    assert median_interval(few) == median_interval(few)  # seeded: the same JSON gives the same interval
    assert median_interval([1.0]) is None


def test_a_speedup_interval_admits_1_only_when_the_rows_overlap():
    sync = [1.0, 1.05, 0.95, 1.02, 0.98, 1.01]
    assert not spans_one(ratio_interval(sync, [v / 2 for v in sync]))  # twice as fast, clearly
    lo, hi = ratio_interval(sync, [v / 2 for v in sync])
    assert lo <= 2.0 <= hi
    assert spans_one(ratio_interval(sync, [v * 1.01 for v in reversed(sync)]))  # the same, within noise
    assert ratio_interval(sync, [1.0]) is None and not spans_one(None)


def _bench_json(tmp_path, name, sync_steps, streaming_steps):
    row = lambda steps: {"step_s": statistics.median(steps), "step_s_all": steps, "steps_measured": len(steps),
                         "staleness_mean": 0.0, "staleness_max": 0, "learner": "micro-batched"}
    doc = {"schedules": {"sync": row(sync_steps), "streaming": row(streaming_steps)},
           "workload": {"name": name, "trajectories_per_step": 256, "rounds": 3},
           "machine": {"cpus": 2, "processor": "x86_64", "load_avg_start": [1.0, 1, 1], "load_avg_end": [1.2, 1, 1]}}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(doc))
    return path


def test_the_readme_table_is_generated_from_the_json_between_its_markers(tmp_path):
    default = _bench_json(tmp_path, "default", [0.60, 0.62, 0.58, 0.61], [0.40, 0.41, 0.39, 0.42])
    readme = tmp_path / "README.md"
    readme.write_text(f"before\n{headline.BEGIN}\nold table\n{headline.END}\nafter\n")
    assert headline.main([str(default), "--write", str(readme)]) == 0
    text = readme.read_text()
    assert text.startswith("before\n") and text.endswith("after\n") and "old table" not in text
    streaming = next(line for line in text.splitlines() if line.startswith("| `streaming`"))
    assert "0.405 s [" in streaming and "(1.49× [" in streaming and "≈" not in streaming
    assert "3 alternating rounds, 4 measured steps per row" in text and "load 1.0 → 1.2" in text
    assert f"python -m bench.headline {default}" in text


def test_the_referee_table_holds_each_row_against_its_simulation_and_marks_the_misses(tmp_path):
    path = _bench_json(tmp_path, "default", [0.60, 0.62, 0.58, 0.61], [0.40, 0.41, 0.39, 0.42])
    doc = json.loads(path.read_text())
    doc["schedules"]["sync"].update(simulated_step_s=0.60, tail_s=0.20, step_equal_work_s=0.61,
                                    simulated_step_equal_work_s=0.50)
    doc["schedules"]["streaming"].update(tail_s=0.05)  # no replay at its own speed: the sync-runs prediction
    doc["simulated"] = {"sync": {"step_s": 0.5, "tail_s": 0.19}, "streaming": {"step_s": 0.30, "tail_s": 0.01}}
    path.write_text(json.dumps(doc))
    target = tmp_path / "bench.md"
    target.write_text(f"x\n{headline.REFEREE_BEGIN}\nstale table\n{headline.REFEREE_END}\ny\n")
    assert headline.main(["--referee", str(path), "--write", str(target)]) == 0
    text = target.read_text()
    sync = next(line for line in text.splitlines() if "| `sync` |" in line)
    streaming = next(line for line in text.splitlines() if "| `streaming` |" in line)
    # its own replay, not the prediction; the equal-work step against the simulator's over the same window
    assert "0.605 / 0.600 s | 1.01 | 0.610 / 0.500 s | **1.22** | 0.200 / 0.190 s" in sync
    assert "0.405 / 0.300 s | **1.35** | – | – | 0.050 / 0.010 s" in streaming
    assert text.startswith("x\n") and text.endswith("y\n") and "stale table" not in text
    assert f"python -m bench.headline --referee {path}" in text


def test_a_missing_or_foreign_json_is_one_line_naming_it(tmp_path, capsys):
    assert headline.main([str(tmp_path / "nope.json")]) == 2
    (tmp_path / "other.json").write_text("{}")
    assert headline.main([str(tmp_path / "other.json")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"json: {tmp_path / 'nope.json'}: no such file", f"json: {tmp_path / 'other.json'}: not a bench JSON with a sync row"]
    with pytest.raises(SystemExit, match="has no"):
        headline.write_between_markers(tmp_path / "other.json", "x")


# ------------------------------------------------------------------ what each row trained


def _steps(lengths, tokens_each=None, reward=0.3):
    return [{"response_length/mean": n, "response/tokens": n * 8.0, "response/turns_mean": 2.0,
             "reward/mean": reward} for n in lengths]


def test_throughput_counts_trained_tokens_and_trajectories_per_second_of_window():
    from learner.bench.trained import trained_figures

    f = trained_figures(_steps([10.0, 12.0]), step_mean_s=2.0)
    assert f["trained_tokens_per_s"] == pytest.approx((80 + 96) / 2 / 2.0)
    assert f["trained_trajectories_per_s"] == pytest.approx(8 / 2.0)
    assert f["response_length_mean"] == 11.0 and f["turns_mean"] == 2.0


def test_a_row_that_trained_shorter_trajectories_is_warned_about_and_one_within_noise_is_not():
    from learner.bench.trained import trained_against_sync

    sync = {"response_length_all": [20.0, 21.0, 19.5, 20.5, 20.2, 19.8], "reward_mean": 0.17}
    short = {"response_length_all": [13.5, 14.0, 13.8, 14.2, 13.9, 14.1], "reward_mean": 0.05}
    same = {"response_length_all": [20.1, 19.9, 20.4, 19.7, 20.6, 20.0], "reward_mean": 0.18}
    out = trained_against_sync("fully-async", short, sync)
    assert out["response_length_vs_sync"] == pytest.approx(13.95 / 20.1, rel=1e-3)
    assert out["trained_warning"].startswith("fully-async trained 31% shorter trajectories than sync")
    assert "reward 0.050 vs 0.170" in out["trained_warning"]
    assert trained_against_sync("streaming", same, sync)["trained_warning"] is None
    assert trained_against_sync("sync", sync, sync)["response_length_vs_sync"] is None


# ------------------------------------------------------------------ equal-work windows


def test_a_window_that_trains_a_backlog_is_charged_for_it():
    from learner.bench.window import equal_work

    def verify(t1, lane="rollout/0/1"):
        return {"type": "span", "kind": "rollout.verify", "lane": lane, "t0": t1 - 0.01, "t1": t1}

    # two measured steps of 4 trajectories in [10, 12]: only 4 rewards arrive inside the window
    # (the other 4 trained were finished before it), and one 2-member group was dropped
    kept = [{"step/t_start": 10.0, "step/t_end": 11.0}, {"step/t_start": 11.0, "step/t_end": 12.0,
                                                        "rollout/dropped_groups": 1.0}]
    events = [verify(t) for t in (9.5, 9.8, 10.5, 10.6, 11.2, 11.4, 11.9, 12.0)] + [verify(11.5, "learner/0")]
    out = equal_work([events], [kept], batch=4, group_size=2)
    assert out["produced_per_step"] == (6 - 2) / 2  # 6 arrivals in (10, 12], 2 of them dropped
    assert out["backlog_per_step"] == (8 - 4) / 2
    assert out["step_equal_work_s"] == pytest.approx(2.0 * 4 / 4)  # 2 s produced one batch
    steady = equal_work([[verify(t) for t in (10.2, 10.4, 10.6, 10.8, 11.2, 11.4, 11.6, 11.8)]],
                        [[{"step/t_start": 10.0, "step/t_end": 11.0}, {"step/t_start": 11.0, "step/t_end": 12.0}]], 4, 2)
    assert steady["backlog_per_step"] == 0 and steady["step_equal_work_s"] == pytest.approx(1.0)


def test_the_race_table_is_generated_from_a_race_json(tmp_path, capsys):
    level = {"level": 0.4, "reached": 2, "seeds": 3, "seconds_median": 12.5, "seconds_ci90": [10.0, 15.0],
             "tokens_median": 900.0, "tokens_ci90": [800.0, 1000.0]}
    doc = {"config": "configs/race.yaml", "steps": 24, "seeds": [0, 1, 2], "smoothing": 0.6, "levels": [0.4],
           "no_level": None, "machine": {"cpus": 2, "load_avg_start": [1.0], "load_avg_end": [1.5]},
           "schedules": {"streaming": {"levels": [level], "final_smoothed_median": 0.45, "final_smoothed_ci90": [0.4, 0.5]},
                         "sync": {"levels": [{**level, "seconds_median": None, "reached": 0}],
                                  "final_smoothed_median": 0.3, "final_smoothed_ci90": None}}}
    (tmp_path / "race.json").write_text(json.dumps(doc))
    assert headline.main(["--race", str(tmp_path / "race.json")]) == 0
    out = capsys.readouterr().out
    assert "| `streaming` | 12.5 s [10.0, 15.0] · 900 [800, 1000] (2/3) | 0.450 [0.400, 0.500] |" in out
    assert "| `sync` | not reached (0/3) | 0.300 |" in out and "load 1.0 → 1.5" in out
    assert headline.main(["--race", str(tmp_path / "a.json"), str(tmp_path / "race.json")]) == 2


def test_a_second_run_is_read_against_the_first_runs_intervals(tmp_path, capsys):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = _bench_json(tmp_path / "a", "default", [0.60, 0.62, 0.58, 0.61], [0.40, 0.41, 0.39, 0.42])
    second = _bench_json(tmp_path / "b", "default", [0.61, 0.60, 0.62, 0.59], [0.50, 0.52, 0.49, 0.51])
    assert headline.main([str(first), "--against", str(second)]) == 0
    text = capsys.readouterr().out
    sync = next(line for line in text.splitlines() if line.startswith("| `sync`"))
    streaming = next(line for line in text.splitlines() if line.startswith("| `streaming`"))
    assert "| yes | 1.00× | 1.00× | – |" in sync and "| **no** | 1.49× [" in streaming
    # the second run's sync is as fast, its streaming slower: its speedup 1.20x falls outside too
    assert streaming.endswith("| 1.20× | **no** |")
    assert "1 of 2 medians and 0 of 1 speedups inside" in text
    assert headline.main([str(first), str(second), "--against", str(second)]) == 2
