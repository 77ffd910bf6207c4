"""The race's HTML report: smoothed reward against wall-clock and against trained tokens, one line
per run, a colour per schedule, the levels dashed; plotly inline, nothing fetched."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

COLORS = {"sync": "#1f77b4", "async": "#ff7f0e", "fully-async": "#2ca02c", "streaming": "#d62728"}


def _figure(doc: dict[str, Any], x: str, title: str) -> go.Figure:
    fig = go.Figure()
    for name, per_seed in doc["curves"].items():
        for i, (seed, c) in enumerate(per_seed.items()):
            fig.add_trace(go.Scatter(x=c[x], y=c["smoothed"], mode="lines", name=f"{name} seed {seed}",
                                     legendgroup=name, showlegend=i == 0 or None,
                                     line={"color": COLORS.get(name, "#333")}))
    for level in doc["levels"]:
        fig.add_hline(y=level, line_dash="dash", annotation_text=f"level {level:.3f}")
    fig.update_layout(title=title, xaxis_title=x, yaxis_title=f"reward/mean, EMA {doc['smoothing']}", height=420)
    return fig


def write_html(doc: dict[str, Any], path: Path, summary: list[str]) -> None:
    """The report of race ``doc`` with its ``summary`` lines above the figures."""
    figs = [_figure(doc, "seconds", "Smoothed reward against wall-clock"),
            _figure(doc, "tokens", "Smoothed reward against trained tokens")]
    body = "".join(f.to_html(full_html=False, include_plotlyjs=False) for f in figs)
    lines = "".join(f"<li>{html.escape(line)}</li>" for line in summary)
    m = doc["machine"]
    path.write_text(
        "<!doctype html><html><head><meta charset='utf-8'><title>thundersync race</title>"
        f"<script>{get_plotlyjs()}</script></head><body><h1>Race: {html.escape(doc['config'])}</h1>"
        f"<p>{doc['steps']} steps per run, seeds {doc['seeds']}, {m.get('cpus')} cpus, load "
        f"{m['load_avg_start'][0]:.1f} → {m['load_avg_end'][0]:.1f}.</p><ul>{lines}</ul>{body}</body></html>")
