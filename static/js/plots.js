// Small plotly helpers shared by the pages: a throttled redraw loop and the metric charts.
import { exportConfig } from "./figureexport.js";

// No plotly branding or sharing links, and no lasso/box selection (nothing on these charts acts on a
// selection; a drag zooms).
export const PLOTLY_CONFIG = {
  displaylogo: false, responsive: true, showLink: false, showSendToCloud: false, showEditInChartStudio: false,
  modeBarButtonsToRemove: ["lasso2d", "select2d"],
};

/**
 * Resolves once plotly.js has run. The run page loads it (the basic partial bundle,
 * vendor/plotly-basic.min.js) with ``defer`` after its own module, so the websocket replay is
 * already on the wire while the browser evaluates the script.
 */
export const plotlyLoaded = window.Plotly ? Promise.resolve() : new Promise((resolve, reject) => {
  const script = document.querySelector('script[src$="plotly.min.js"], script[src$="plotly-basic.min.js"]');
  if (!script) { reject(new Error("plotly.js is not on this page")); return; }
  script.addEventListener("load", () => resolve(), { once: true });
  script.addEventListener("error", () => reject(new Error("plotly.min.js failed to load")), { once: true });
});

/**
 * A share (0-1] of one core that several redraw loops spend together: after a draw of c ms,
 * every loop sharing it waits until c × (1/share − 1) ms have passed, so that the page's
 * redraws (Gantt and charts alike) stay within that share however slow the machine, and a run
 * on the same cores keeps the rest.
 */
export class DrawBudget {
  constructor(share = 1) {
    if (!(share > 0 && share <= 1)) throw new Error(`DrawBudget: share must be in (0, 1], got ${share}`);
    this.share = share;
    this.readyAt = 0; // performance.now() before which no loop of this budget draws
    this.spentMs = 0; // every draw's time, for the debug hooks
  }

  /** A new share from now on: the wait left after the last draw is rescaled to it. */
  setShare(share) {
    if (!(share > 0 && share <= 1)) throw new Error(`DrawBudget: share must be in (0, 1], got ${share}`);
    const now = performance.now(), left = this.readyAt - now;
    if (left > 0 && this.share < 1) this.readyAt = now + left * (1 / share - 1) / (1 / this.share - 1);
    this.share = share;
  }

  /** Books a draw of ``took`` ms that ended now. */
  spent(took) {
    this.spentMs += took;
    this.readyAt = Math.max(this.readyAt, performance.now()) + took * (1 / this.share - 1);
  }
}

/**
 * Calls ``draw`` (sync or async) from requestAnimationFrame, at most once per ``minIntervalMs``
 * (a number or a function returning one), however often ``request`` is called: bursts of
 * websocket frames cost one redraw, and a redraw never overlaps the previous one. ``budget``
 * (a DrawBudget, shared by the page's loops; else one of ``share`` for this loop alone) bounds
 * the time spent drawing. ``request({now: true})`` (a user's zoom, a new view) draws at once,
 * interval and budget skipped; its time is booked all the same.
 */
export function throttledRedraw(draw, minIntervalMs = 250, { share = 1, budget = new DrawBudget(share) } = {}) {
  const base = typeof minIntervalMs === "function" ? minIntervalMs : () => minIntervalMs;
  // ``last`` starts now: the first redraw also waits an interval unless requested with ``now``.
  let pending = false, last = performance.now(), running = false, again = false, urgent = false;
  const run = async () => {
    // another loop of the budget may have drawn since this one was scheduled
    if (!urgent && performance.now() < budget.readyAt) {
      timer = setTimeout(() => requestAnimationFrame(run), budget.readyAt - performance.now());
      return;
    }
    running = true; urgent = false;
    await plotlyLoaded.catch(() => {}); // waiting for plotly.js to load is no drawing time
    const started = performance.now();
    try { await draw(); } finally {
      budget.spent(performance.now() - started);
      running = false; last = performance.now(); pending = false;
      if (again) { again = false; request(); }
    }
  };
  let timer = null;
  /** ``now``: skip the remaining interval (a pending redraw is pulled forward too). */
  function request({ now = false } = {}) {
    if (running) { again = true; return; }
    if (pending && !now) return;
    clearTimeout(timer);
    pending = true;
    urgent = urgent || now;
    const wait = now ? 0 : Math.max(0, last + base() - performance.now(), budget.readyAt - performance.now());
    timer = setTimeout(() => requestAnimationFrame(run), wait);
  }
  return request;
}

/** [{step, values}] -> {x: steps, y: values[key] * scale} for steps that have the key. */
export function metricSeries(metrics, key, scale = 1) {
  const x = [], y = [];
  for (const m of [...metrics].sort((a, b) => a.step - b.step)) {
    const v = m.values[key];
    if (v !== undefined && v !== null && Number.isFinite(Number(v))) { x.push(m.step); y.push(Number(v) * scale); }
  }
  return { x, y };
}

/** A plotly figure of named series; kind "bar" groups bars, anything else draws lines+markers. */
export function seriesFigure(series, { kind = "line", xTitle = "step", yTitle = "", yRange = null, height = 260 } = {}) {
  const data = series.map((s) => (kind === "bar"
    ? { type: "bar", name: s.name, x: s.x, y: s.y, marker: s.colour ? { color: s.colour } : undefined }
    : { type: "scatter", mode: "lines+markers", name: s.name, x: s.x, y: s.y, ...(s.opacity ? { opacity: s.opacity } : {}),
        line: { width: 2, ...(s.dash ? { dash: s.dash } : {}), ...(s.colour ? { color: s.colour } : {}) }, marker: { size: 5 } }));
  return {
    data,
    layout: {
      height, barmode: "group", margin: { l: 56, r: 16, t: 12, b: 44 },
      xaxis: { title: { text: xTitle }, zeroline: false, ...(xTitle === "step" ? { dtick: 1, tickformat: "d" } : {}) },
      yaxis: { title: { text: yTitle }, ...(yRange ? { range: yRange } : { rangemode: "tozero" }) },
      legend: { orientation: "h", y: 1.02, yanchor: "bottom", font: { size: 11 } },
      paper_bgcolor: "#fff", plot_bgcolor: "#fff", font: { size: 12 }, uirevision: "metrics",
    },
  };
}

/** Draws a figure, or a short "no data" note when every series is empty. */
export async function drawFigure(el, figure, emptyText = "No data yet.") {
  await plotlyLoaded;
  const hasData = figure.data.some((t) => (t.x && t.x.length) || (t.y && t.y.length));
  el.dataset.empty = hasData ? "0" : "1";
  if (!hasData) figure = { data: [], layout: { ...figure.layout,
    annotations: [{ text: emptyText, showarrow: false, xref: "paper", yref: "paper", x: 0.5, y: 0.5, font: { color: "#5f6b7c" } }],
    xaxis: { visible: false }, yaxis: { visible: false } } };
  return Plotly.react(el, figure.data, figure.layout, exportConfig(PLOTLY_CONFIG));
}
