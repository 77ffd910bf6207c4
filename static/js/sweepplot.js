// A sweep's plot (compare page of a comparison with a swept field): a chosen figure of the
// summary (GET /api/compare/, controller/comparisons/compare.py) against the swept value, one line per
// schedule. Bars: where a value and schedule have several runs (repeats), their min to max
// around the mean; with one run, the figure's own spread where the summary has one (the step
// time's p10-p90 over the steps, the speedup's from it).
import { drawFigure, seriesFigure } from "./plots.js";

export const SWEEP_METRICS = {
  step_s: { label: "median step (s)", lo: "step_p10_s", hi: "step_p90_s" },
  speedup_vs_sync: { label: "speedup vs sync (×)", lo: "speedup_p10", hi: "speedup_p90" },
  final_reward: { label: "final reward/mean" },
  learner_idle: { label: "learner idle (%)", scale: 100 },
  efficiency: { label: "efficiency (%)", scale: 100 },
  staleness_mean: { label: "staleness, mean (policy versions)" },
  time_to_reward_s: { label: "time to reward (s)" },
};
const SCHEDULE_COLOURS = { sync: "#4c78a8", async: "#f28e2b", "fully-async": "#b07aa1", streaming: "#e15759" };

const mean = (xs) => xs.reduce((a, b) => a + b, 0) / xs.length;

/**
 * One series per schedule: x the swept values (sorted), y the metric (mean over repeats), and the
 * bars' ends. ``runs``: [{id, schedule, sweepValue}]; ``figures``: the summary's runs by id.
 */
export function sweepSeries(runs, figures, key) {
  const { lo, hi, scale = 1 } = SWEEP_METRICS[key];
  const bySchedule = new Map();
  for (const r of runs) {
    const f = figures.get(r.id), v = f?.[key];
    if (typeof v !== "number" || r.sweepValue === null || r.sweepValue === undefined) continue;
    const values = bySchedule.get(r.schedule) ?? new Map();
    bySchedule.set(r.schedule, values);
    const at = values.get(r.sweepValue) ?? [];
    values.set(r.sweepValue, at);
    at.push({ v: v * scale, lo: lo && typeof f[lo] === "number" ? f[lo] * scale : null, hi: hi && typeof f[hi] === "number" ? f[hi] * scale : null });
  }
  return [...bySchedule].map(([schedule, values]) => {
    const xs = [...values.keys()].sort((a, b) => (typeof a === "number" && typeof b === "number" ? a - b : String(a).localeCompare(String(b))));
    const points = xs.map((x) => {
      const at = values.get(x), y = mean(at.map((p) => p.v));
      const [low, high] = at.length > 1 ? [Math.min(...at.map((p) => p.v)), Math.max(...at.map((p) => p.v))]
        : [at[0].lo ?? y, at[0].hi ?? y];
      return { x, y, low: Math.min(low, high), high: Math.max(low, high), n: at.length };
    });
    return { schedule, points };
  });
}

/** Draws ``key`` of the summary against the swept ``field`` into ``div``. */
export function drawSweep(div, runs, summary, key, field) {
  const figures = new Map(summary.runs.map((f) => [f.id, f]));
  const series = sweepSeries(runs, figures, key);
  const figure = seriesFigure(series.map((s) => ({
    name: s.schedule, colour: SCHEDULE_COLOURS[s.schedule], x: s.points.map((p) => p.x), y: s.points.map((p) => p.y),
  })), { xTitle: field, yTitle: SWEEP_METRICS[key].label, height: 300 });
  figure.data.forEach((trace, i) => {
    const points = series[i].points;
    trace.error_y = { type: "data", symmetric: false, array: points.map((p) => p.high - p.y),
      arrayminus: points.map((p) => p.y - p.low), thickness: 1.5, width: 4 };
    trace.customdata = points.map((p) => p.n);
    trace.hovertemplate = `${field} %{x}: %{y:.4g} (%{customdata} run(s))<extra>${series[i].schedule}</extra>`;
  });
  const numeric = runs.every((r) => typeof r.sweepValue === "number");
  const positive = numeric && runs.every((r) => r.sweepValue > 0);
  const values = runs.map((r) => r.sweepValue);
  // a learning-rate-like sweep spans decades: a log axis keeps its points apart
  const logScale = positive && Math.max(...values) / Math.min(...values) >= 3;
  figure.layout.xaxis = { title: { text: field }, zeroline: false,
    ...(numeric ? { type: logScale ? "log" : "linear", tickvals: [...new Set(values)], exponentformat: "e" } : { type: "category" }) };
  return drawFigure(div, figure, "No run of the sweep has this figure yet.").then(() => { div.dataset.metric = key; });
}
