"""What ``thundersync bench`` prints: one row per bench row, then the workload and the gains."""

from __future__ import annotations

from typing import Any

COLUMNS = [("learner", "learner", "{}"), ("step_s", "step_s", "{:.2f}"), ("spread", None, None),
           ("R", "rollout_s", "{:.2f}"), ("L", "learner_s", "{:.2f}"), ("engine", "engine_busy_s", "{:.2f}"),
           ("bound", "bound_s", "{:.2f}"), ("eff", "efficiency", "{:.2f}"),
           ("speedup", "speedup_vs_sync", "{:.2f}x"), ("tok/s", "trained_tokens_per_s", "{:.0f}"),
           ("len", "response_length_mean", "{:.1f}"), ("slow10", "slowest_decile_share", "{:.0%}"), ("trainer idle", "trainer_idle_ratio", "{:.1%}"),
           ("trainer wait", "trainer_wait_ratio", "{:.1%}"), ("rollout idle", "rollouter_idle_ratio", "{:.1%}"),
           ("stale", None, None), ("tail_s", "tail_s", "{:.2f}"),
           ("kept", "kept_token_share", "{:.1%}"), ("whole", "whole_draft_share", "{:.1%}"),
           ("busy", "busy_share", "{:.1%}"),
           ("rss_mb", "peak_rss_mb", "{:.0f}"), ("bwd ms", "backward_ms", "{:.1f}"),
           ("same-speed speedup", "speedup_same_speed", "{:.2f}x"), ("sim step_s", "simulated_step_s", "{:.2f}"),
           ("equal-work", "step_equal_work_s", "{:.2f}"), ("sim equal-work", "simulated_step_equal_work_s", "{:.2f}")]


def format_table(results: dict[str, dict[str, Any]]) -> str:
    rows = [["row", *(c[0] for c in COLUMNS)]]
    for name, r in results.items():
        row = [name]
        for title, key, fmt in COLUMNS:
            if title == "spread":
                row.append(f"{r['step_s_min']:.2f}-{r['step_s_max']:.2f}")
            elif title == "stale":
                row.append(f"{r['staleness_mean']:.2f}/{r['staleness_max']}")
            else:
                row.append(fmt.format(r[key]) if r.get(key) is not None else "-")
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))) for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def summary_text(doc: dict[str, Any]) -> str:
    """The table, the workload (its R/L, its trajectories' tail, the load) and the gains."""
    w, machine = doc["workload"], doc["machine"]
    lines = [format_table(doc["schedules"]),
             f"workload: {w['trajectories_per_step']} trajectories/step, tool-latency scale "
             f"{w['tool_latency']['scale']:.3g}, R/L = {w['balance_measured']:.2f} (target {w['balance_target']}); "
             f"load avg {machine['load_avg_start'][0]:.1f} -> {machine['load_avg_end'][0]:.1f} on {machine['cpus']} cpus"]
    tail = w.get("trajectory_time") or {}
    if tail:
        lines.append(f"trajectory time (sync, {tail['trajectories']} trajectories): p50 {tail['p50_s']:.2f} s, "
                     f"p99 {tail['p99_s']:.2f} s, max {tail['max_s']:.2f} s, p99/p50 {tail['p99_over_p50']:.1f}")
    lines += [f"warning: {r['trained_warning']}" for r in doc["schedules"].values() if r.get("trained_warning")]
    gains = doc.get("speculation") or {}
    if gains:
        lines.append("gains: " + ", ".join(f"{k.replace('_', ' ')} {v:.2f}x" for k, v in gains.items()))
    return "\n".join(lines)
