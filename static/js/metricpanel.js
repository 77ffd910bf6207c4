// "Every metric" panel (run page and compare page): a searchable list of every metric name the
// runs recorded (tick any number), optional smoothing drawn over the raw line, step or
// wall-time axis; one chart per picked metric, one line per run. Ratios and shares are drawn in
// percent, as everywhere else on the pages. Built from the stored per-step metrics
// ({step, values}); nothing is hard-coded.
import { METRIC } from "./conventions.js";
import { drawFigure, seriesFigure } from "./plots.js";
import { systemLabel } from "./sysnames.js";

const DEFAULT_PICKS = [METRIC.GRAD_NORM, METRIC.TOKENS];
const WALL = "wall";
// 0-1 fractions the pages show in percent (idle and wait ratios, token shares)
const PERCENT = /(idle|wait)_ratio$|_share$/;
export const inPercent = (key) => PERCENT.test(key);

/** The learner's clock when the run's first step started (after boot): min step/t_start. */
export function firstStepStart(metrics) {
  const starts = metrics.map((m) => m.values[METRIC.T_START]).filter((v) => typeof v === "number");
  return starts.length ? Math.min(...starts) : 0;
}

/**
 * Points of ``key`` in step order: x = step, or seconds from ``origin`` (default the first step's
 * start) to the step's end (``axis`` "wall"); y smoothed by an exponential moving average of weight
 * ``smoothing`` (0 = the stored values).
 */
export function metricPoints(metrics, key, { axis = "step", smoothing = 0, origin = firstStepStart(metrics) } = {}) {
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

function choice(name, checked) {
  const label = document.createElement("label");
  const box = document.createElement("input");
  box.type = "checkbox";
  box.value = name;
  box.checked = checked;
  const text = document.createElement("span");
  text.textContent = name;
  const role = systemLabel(name); // a process curve: which process (learner, rollout worker) and what
  if (role) {
    const note = document.createElement("span");
    note.className = "metric-role";
    note.textContent = role;
    text.append(note);
  }
  label.append(box, text);
  label.dataset.metric = name;
  label.dataset.search = `${name} ${role}`.toLowerCase();
  label.title = role ? `${name}: ${role}` : name;
  return label;
}

export class MetricPanel {
  /** ``root``: an element holding #metric-search, #metric-picker, #metric-smoothing, #metric-axis and
   * #metric-charts. ``onScreen``: an OnScreen (static/js/onscreen.js) to draw each chart only
   * while it is in view; without it every picked chart draws on every update. */
  constructor(root, { onScreen = null } = {}) {
    this.root = root;
    this.onScreen = onScreen;
    this.search = root.querySelector("#metric-search");
    this.picker = root.querySelector("#metric-picker");
    this.smoothing = root.querySelector("#metric-smoothing");
    this.axis = root.querySelector("#metric-axis");
    this.charts = root.querySelector("#metric-charts");
    this.runs = []; // [{name, colour, metrics: [{step, values}]}]
    this.names = [];
    for (const input of [this.picker, this.smoothing, this.axis]) input.addEventListener("change", () => this.draw());
    this.search.addEventListener("input", () => this.filter());
  }

  /** Shows the names containing every word typed in the search box (case-insensitive), a
   * process curve's role and quantity included ("learner rss" finds system/driver/rss_mb). */
  filter() {
    const words = this.search.value.toLowerCase().split(/\s+/).filter(Boolean);
    for (const label of this.picker.children) {
      const text = label.dataset.search;
      label.hidden = !words.every((w) => text.includes(w));
    }
  }

  /** New data (every run's metrics so far); refreshes the picker's names and the charts. */
  update(runs) {
    this.list(runs);
    return this.draw();
  }

  /** New data without drawing: the picker lists every name at once, while the charts' redraw
   * may wait for the page's draw budget (static/js/plots.js). */
  list(runs) {
    this.runs = runs;
    const names = new Set();
    for (const r of runs) for (const m of r.metrics) for (const k of Object.keys(m.values)) names.add(k);
    const sorted = [...names].sort();
    if (sorted.join("\n") !== this.names.join("\n")) this.setNames(sorted);
  }

  setNames(names) {
    const picked = new Set(this.picked());
    const first = this.names.length === 0;
    this.names = names;
    this.picker.replaceChildren(...names.map((n) => choice(n, first ? DEFAULT_PICKS.includes(n) : picked.has(n))));
    this.filter();
  }

  picked() { return [...this.picker.querySelectorAll("input:checked")].map((o) => o.value); }

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
      hint.textContent = "Tick metrics in the list (search to narrow it).";
      divs.push(hint);
    }
    if (this.onScreen) for (const old of this.charts.querySelectorAll(".chart")) if (!divs.includes(old)) this.onScreen.forget(old);
    this.charts.replaceChildren(...divs);
    this.root.dataset.picked = keys.join(",");
    await Promise.all(keys.map((key, i) => {
      const scale = inPercent(key) ? 100 : 1;
      const points = (r, weight) => {
        const { x, y } = metricPoints(r.metrics, key, { axis, smoothing: weight });
        return { x, y: y.map((v) => v * scale) };
      };
      // smoothing draws over the raw values, which stay visible (faint)
      const series = this.runs.flatMap((r) => (smoothing > 0
        ? [{ name: `${r.name} raw`, colour: r.colour, opacity: 0.3, raw: true, ...points(r, 0) },
          { name: `${r.name} EMA ${smoothing}`, colour: r.colour, ...points(r, smoothing) }]
        : [{ name: r.name, colour: r.colour, ...points(r, 0) }]));
      const figure = seriesFigure(series, {
        xTitle: axis === WALL ? "seconds since the first step started" : "step",
        yTitle: (systemLabel(key) || key) + (scale === 100 ? " (%)" : ""), height: 240,
        yRange: scale === 100 ? [0, 100] : null,
      });
      divs[i].dataset.exportName = key;
      return this.onScreen ? this.onScreen.draw(divs[i], () => drawFigure(divs[i], figure)) : drawFigure(divs[i], figure);
    }));
  }
}
