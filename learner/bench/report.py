"""The bench's HTML report: one self-contained page (plotly.js embedded from the installed
plotly package, no CDN) drawn from the ``--json`` document alone."""

from __future__ import annotations

import html
from typing import Any

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs
from learner.registries.schedules import BASELINE  # a row is named after its schedule (+ a variant)

COLORS = {"sync": "#7f7f7f", "sync-per-trajectory": "#c7c7c7", "async": "#1f77b4", "fully-async": "#9467bd",
          "streaming": "#d62728", "sync+spec": "#8c564b", "streaming+spec": "#ff7f0e"}
TABLE = [("learner", "learner", "{}"), ("step_s (median)", "step_s", "{:.2f}"), ("min-max", None, None), ("R rollout_s", "rollout_s", "{:.2f}"),
         ("L learner_s", "learner_s", "{:.2f}"), ("engine busy s", "engine_busy_s", "{:.2f}"),
         ("learner work s", "learner_work_s", "{:.2f}"), ("bound_s", "bound_s", "{:.2f}"),
         ("efficiency", "efficiency", "{:.2f}"),
         ("speedup vs sync", "speedup_vs_sync", "{:.2f}x"), ("trainer idle", "trainer_idle_ratio", "{:.1%}"),
         ("trainer wait", "trainer_wait_ratio", "{:.1%}"),
         ("rollouter idle", "rollouter_idle_ratio", "{:.1%}"), ("staleness mean/max", None, None),
         ("first backward s", "first_backward_s", "{:.2f}"), ("tail_s", "tail_s", "{:.2f}"),
         ("kept-token share", "kept_token_share", "{:.1%}"), ("whole-draft share", "whole_draft_share", "{:.1%}"),
         ("engine busy share", "busy_share", "{:.1%}"),
         ("peak RSS MB", "peak_rss_mb", "{:.0f}"), ("backward ms (machine speed)", "backward_ms", "{:.1f}"),
         ("speedup vs sync at the same speed", "speedup_same_speed", "{:.2f}x"),
         ("simulated step_s (at that speed)", "simulated_step_s", "{:.2f}"),
         ("sim error", "simulated_error", "{:+.1%}")]


def _cell(r: dict[str, Any], title: str, key: str | None, fmt: str | None) -> str:
    if title == "min-max":
        return f"{r['step_s_min']:.2f}-{r['step_s_max']:.2f}"
    if title.startswith("staleness"):
        return f"{r['staleness_mean']:.2f}/{r['staleness_max']}"
    return fmt.format(r[key]) if r.get(key) is not None else "-"


def _table(schedules: dict[str, dict[str, Any]]) -> str:
    head = "".join(f"<th>{html.escape(t)}</th>" for t, _, _ in TABLE)
    rows = "".join(
        f"<tr><th>{html.escape(name)}</th>" + "".join(f"<td>{_cell(r, *c)}</td>" for c in TABLE) + "</tr>"
        for name, r in schedules.items()
    )
    return f"<table><tr><th>schedule</th>{head}</tr>{rows}</table>"


def _step_figure(schedules: dict[str, dict[str, Any]]) -> go.Figure:
    names = list(schedules)
    med = [schedules[n]["step_s"] for n in names]
    fig = go.Figure(go.Bar(
        x=names, y=med, name="measured (median; bars: min-max)", marker_color=[COLORS.get(n, "#333") for n in names],
        error_y={"type": "data", "symmetric": False, "array": [schedules[n]["step_s_max"] - m for n, m in zip(names, med)],
                 "arrayminus": [m - schedules[n]["step_s_min"] for n, m in zip(names, med)]},
    ))
    sim = [schedules[n].get("simulated_step_s") for n in names]
    if any(v is not None for v in sim):
        fig.add_trace(go.Scatter(x=names, y=sim, mode="markers",
                                 name="simulated (the sync runs replayed at its machine speed)",
                                 marker={"symbol": "diamond", "size": 12, "color": "black"}))
    sync = schedules["sync"]
    fig.add_trace(go.Scatter(x=names, y=[schedules[n]["bound_s"] for n in names], mode="markers",
                             name="bound: the least step this row's own work allows under its schedule",
                             marker={"symbol": "line-ew-open", "size": 24, "color": "black"}))
    fig.add_hline(y=sync["rollout_s"] + sync["learner_s"], line_dash="dot", annotation_text="R + L")
    fig.update_layout(title="Step time per schedule", yaxis_title="seconds per optimizer step", height=420)
    return fig


def _idle_figure(schedules: dict[str, dict[str, Any]]) -> go.Figure:
    names = list(schedules)
    fig = go.Figure([
        go.Bar(x=names, y=[schedules[n]["trainer_idle_ratio"] for n in names], name="learner idle"),
        go.Bar(x=names, y=[schedules[n].get("trainer_wait_ratio", 0.0) for n in names], name="learner waiting for data"),
        go.Bar(x=names, y=[schedules[n]["rollouter_idle_ratio"] for n in names], name="rollout idle"),
    ])
    fig.update_layout(title="Idle share of the measured steps", yaxis_tickformat=".0%", barmode="group", height=380)
    return fig


def _timeline_figure(schedules: dict[str, dict[str, Any]]) -> go.Figure:
    """One measured step per schedule: when the learner and the rollout were busy, and when rewards arrived."""
    fig = go.Figure()
    for name, r in schedules.items():
        tl = r["timeline"]
        for lane, color in (("learner", COLORS.get(name, "#333")), ("rollout", "#2ca02c")):
            row = f"{name} {lane}"
            fig.add_trace(go.Bar(y=[row] * len(tl[lane]), x=[b - a for a, b in tl[lane]], base=[a for a, _ in tl[lane]],
                                 orientation="h", marker_color=color, showlegend=False,
                                 hovertemplate=f"{row}<br>%{{base:.3f}}s + %{{x:.3f}}s<extra></extra>"))
        fig.add_trace(go.Scatter(x=tl["rewards"], y=[f"{name} rollout"] * len(tl["rewards"]), mode="markers",
                                 marker={"symbol": "line-ns-open", "size": 10, "color": "black"}, showlegend=False,
                                 hovertemplate="reward at %{x:.3f}s<extra></extra>"))
    fig.update_layout(title="Where one step's time goes (first measured step; ticks: rewards)",
                      xaxis_title="seconds from the step's start", barmode="overlay",
                      height=120 + 60 * len(schedules), yaxis={"autorange": "reversed"})
    return fig


def _sweep_figure(points: list[dict[str, Any]]) -> go.Figure:
    fig = go.Figure()
    xs = [p["balance_measured"] for p in points]
    lo, hi = min(xs + [0.2]), max(xs + [5.0])
    grid = [lo * (hi / lo) ** (i / 100) for i in range(101)]
    fig.add_trace(go.Scatter(x=grid, y=[(1 + x) / max(1.0, x) for x in grid], mode="lines", name="ideal (R+L)/max(R,L)",
                             line={"dash": "dash", "color": "#aaa"}))
    names = sorted({n for p in points for n in p["measured"] if n != BASELINE},
                   key=lambda n: list(COLORS).index(n))
    for name in names:
        have = [p for p in points if name in p["measured"]]
        color = COLORS.get(name, "#333")
        fig.add_trace(go.Scatter(x=[p["balance_measured"] for p in have], y=[p["measured"][name]["speedup_vs_sync"] for p in have],
                                 mode="markers", name=f"{name} measured", marker={"size": 11, "color": color}))
        sim = [p for p in have if name in p["simulated"]]
        fig.add_trace(go.Scatter(x=[p["balance_measured"] for p in sim], y=[p["simulated"][name]["speedup_vs_sync"] for p in sim],
                                 mode="lines+markers", name=f"{name} simulated", line={"color": color},
                                 marker={"symbol": "diamond-open", "size": 9}))
    fig.update_layout(title="Speedup vs sync over the rollout/learner balance", xaxis={"type": "log", "title": "R / L (measured)"},
                      yaxis_title="sync step / schedule step", height=440)
    return fig


def _latency(lat: dict[str, Any]) -> str:
    shape = f"alpha {lat['alpha']:g}" if lat["distribution"] == "pareto" else f"sigma {lat['sigma']:g}"
    cut = f", cut at {lat['max_s']:g}s" if lat.get("max_s") is not None else ""
    return f"{lat['distribution']} median {lat['median_s']:g}s, {shape}{cut}, scale {lat['scale']:.3g}"


def _tail(t: dict[str, Any] | None) -> str:
    if not t:
        return ""
    return (f" Trajectory time (sync runs, {t['trajectories']} trajectories): p50 {t['p50_s']:.2f}s, "
            f"p99 {t['p99_s']:.2f}s, p99/p50 {t['p99_over_p50']:.1f}.")


def _description(doc: dict[str, Any]) -> str:
    w, m = doc["workload"], doc.get("machine", {})
    lat = w["tool_latency"]
    target = f" (target {w['balance_target']:g})" if w.get("balance_target") is not None else " (scale given)"
    load = ""
    if "load_avg_start" in m:
        load = f"; load average {m['load_avg_start'][0]:.1f} at the start, {m.get('load_avg_end', [float('nan')])[0]:.1f} at the end"
    return (
        f"<p>Workload: {html.escape(str(w['model']))} on {html.escape(w['task'])}, {w['objective']} (kl_coef {w['kl_coef']:g}), "
        f"{w['prompts_per_step']} prompts x {w['group_size']} = {w['trajectories_per_step']} trajectories per step, "
        f"{w['steps_per_schedule']} steps per schedule ({w['warmup_steps']} warm-up dropped), seed {w['seed']}. "
        f"Modelled tool latency: {_latency(lat)}. Measured R = {w['rollout_s']:.2f}s, L = {w['learner_s']:.2f}s, "
        f"R/L = {w['balance_measured']:.2f}{target}.{_tail(w.get('trajectory_time'))}</p>"
        + "".join(f"<p class='warning'><b>Trained distribution:</b> {html.escape(r['trained_warning'])}</p>"
                  for r in doc["schedules"].values() if r.get("trained_warning")) +
        f"<p>Machine: {m.get('cpus', '?')} cpus, learner on core {m.get('learner_core', '?')}, rollout on "
        f"{m.get('rollout_cores', '?')}, torch {html.escape(str(m.get('torch', '?')))}{load}.</p>"
        "<p>R: the sync run's median time from step start to the last reward (the rollout running alone); "
        "L: the sync run's median time from its first backward to the end of the step (the learner alone, "
        "every reward in hand). "
        "bound: the least step the row's own engine and learner work allow under its schedule (sync: engine + "
        "learner; streaming: max(engine + optimizer and publish, learner); async, fully-async and speculative rows: "
        "max(engine, learner); engine: generation, tools' real time, verification, not the modelled waits); "
        "efficiency = bound / mean step, at most 1, whatever rows are compared. "
        "See docs/bench-report.md.</p>"
    )


def render_html(doc: dict[str, Any]) -> str:
    schedules = doc["schedules"]
    figures = [_step_figure(schedules), _idle_figure(schedules), _timeline_figure(schedules)]
    if doc.get("sweep"):
        figures.append(_sweep_figure(doc["sweep"]))
    plots = "\n".join(f.to_html(full_html=False, include_plotlyjs=False) for f in figures)
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>thundersync bench</title>"
        "<style>body{font-family:sans-serif;margin:2em;max-width:1200px}table{border-collapse:collapse;font-size:13px}"
        "td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}</style>"
        f"<script>{get_plotlyjs()}</script></head><body><h1>thundersync bench</h1>"
        f"{_description(doc)}{_table(schedules)}{plots}</body></html>\n"
    )
