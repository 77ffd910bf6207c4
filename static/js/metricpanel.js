// "Every metric" panel (run page and compare page): a picker over every metric name the runs
// recorded, optional smoothing, step or wall-time axis; one chart per picked metric, one line
// per run. Built from the stored per-step metrics ({step, values}); nothing is hard-coded.
import { METRIC } from "./conventions.js";
import { drawFigure, seriesFigure } from "./plots.js";

const DEFAULT_PICKS = [METRIC.GRAD_NORM, METRIC.TOKENS];
const WALL = "wall";

/** The learner's clock when the run's first step started (after boot): min step/t_start. */
export function firstStepStart(metrics) {
  const starts = metrics.map((m) => m.values[METRIC.T_START]).filter((v) => typeof v === "number");
  return starts.length ? Math.min(...starts) : 0;
}

/**
 * Points of ``key`` in step order: x = step, or seconds from the first step's start to the
 * step's end (``axis`` "wall"); y smoothed by an exponential moving average of weight
 * ``smoothing`` (0 = the stored values).
 */
export function metricPoints(metrics, key, { axis = "step", smoothing = 0 } = {}) {
  const origin = firstStepStart(metrics);
  const x = [], y = [];
  let avg = null;
  for (const m of [...metrics].sort((a, b) => a.step - b.step)) {
    const v = m.values[key];
    if (typeof v !== "number" || !Number.isFinite(v)) continue;
    const end = m.values[METRIC.T_END];
    if (axis === WALL && typeof end !== "number") continue;
    avg = avg === null || !(smoothing > 0) ? v : smoothing * avg + (1 - smoothing) * v;
    x.push(axis === WALL ? end - origin : m.step);
    y.push(avg);
  }
  return { x, y };
}

function option(value, text = value) {
  const o = document.createElement("option");
  o.value = value;
  o.textContent = text;
  return o;
}

export class MetricPanel {
  /** ``root``: an element holding #metric-picker, #metric-smoothing, #metric-axis and #metric-charts. */
  constructor(root) {
    this.root = root;
    this.picker = root.querySelector("#metric-picker");
    this.smoothing = root.querySelector("#metric-smoothing");
    this.axis = root.querySelector("#metric-axis");
    this.charts = root.querySelector("#metric-charts");
    this.runs = []; // [{name, colour, metrics: [{step, values}]}]
    this.names = [];
    for (const input of [this.picker, this.smoothing, this.axis]) input.addEventListener("change", () => this.draw());
  }

  /** New data (every run's metrics so far); refreshes the picker's names and the charts. */
  update(runs) {
    this.runs = runs;
    const names = new Set();
    for (const r of runs) for (const m of r.metrics) for (const k of Object.keys(m.values)) names.add(k);
    const sorted = [...names].sort();
    if (sorted.join("\n") !== this.names.join("\n")) this.setNames(sorted);
    return this.draw();
  }

  setNames(names) {
    const picked = new Set(this.picked());
    const first = this.names.length === 0;
    this.names = names;
    this.picker.replaceChildren(...names.map((n) => option(n)));
    for (const o of this.picker.options) o.selected = first ? DEFAULT_PICKS.includes(o.value) : picked.has(o.value);
  }

  picked() { return [...this.picker.selectedOptions].map((o) => o.value); }

  async draw() {
    const keys = this.picked();
    const axis = this.axis.value, smoothing = Number(this.smoothing.value) || 0;
    const divs = keys.map((key) => {
      let div = this.charts.querySelector(`[data-metric="${CSS.escape(key)}"]`);
      if (!div) {
        div = document.createElement("div");
        div.className = "chart";
        div.dataset.metric = key;
      }
      return div;
    });
    if (!keys.length) {
      const hint = document.createElement("p");
      hint.className = "empty";
      hint.textContent = "Pick metrics in the list (ctrl- or shift-click for several).";
      divs.push(hint);
    }
    this.charts.replaceChildren(...divs);
    this.root.dataset.picked = keys.join(",");
    await Promise.all(keys.map((key, i) => {
      const series = this.runs.map((r) => ({ name: r.name, colour: r.colour, ...metricPoints(r.metrics, key, { axis, smoothing }) }));
      const figure = seriesFigure(series, {
        xTitle: axis === WALL ? "seconds since the first step started" : "step",
        yTitle: key + (smoothing > 0 ? ` (EMA ${smoothing})` : ""), height: 240,
      });
      return drawFigure(divs[i], figure);
    }));
  }
}
