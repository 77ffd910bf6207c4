// Gantt chart of spans: one plotly trace per span kind (never one trace per span) on a
// categorical lane axis, so a run with tens of thousands of spans stays one cheap figure.
// Bars too small to see are merged (see mergeBars).
import { kindColour, orderKinds } from "./spans.js";

const LANE_PX = 16;
// Above this many bars inside the window, bars are merged at pixel resolution there too.
const MAX_DETAILED_BARS = 40000;

function fmt(v) { return v === null || v === undefined ? "–" : v; }

/** Hover text of one span, built once per span and cached on it. */
function hoverText(s) {
  if (!s._hover) {
    s._hover = `<b>${s.kind}</b> · ${s.lane}<br>` +
      `step ${fmt(s.step)} · traj ${fmt(s.traj)} · group ${fmt(s.group)} · turn ${fmt(s.turn)}<br>` +
      `policy v${fmt(s.policy_version)} · tokens ${fmt(s.tokens)}<br>` +
      `${s.t0.toFixed(3)}–${s.t1.toFixed(3)} s (${((s.t1 - s.t0) * 1000).toFixed(1)} ms) · seq ${s.seq}`;
  }
  return s._hover;
}

/**
 * Bars for ``spans``: per (lane, kind), consecutive spans whose gap is below ``resolution``
 * seconds become one bar carrying their count ``n``. resolution 0 keeps every span as its own bar.
 * Returns [{lane, kind, t0, t1, n, span}] where ``span`` is set only for unmerged bars.
 */
export function mergeBars(spans, resolution) {
  if (!(resolution > 0)) return spans.map((s) => ({ lane: s.lane, kind: s.kind, t0: s.t0, t1: s.t1, n: 1, span: s }));
  const groups = new Map();
  for (const s of spans) {
    const key = `${s.lane}\u0000${s.kind}`;
    if (!groups.has(key)) groups.set(key, []);
    groups.get(key).push(s);
  }
  const bars = [];
  for (const list of groups.values()) {
    list.sort((a, b) => a.t0 - b.t0);
    let cur = null;
    for (const s of list) {
      if (cur && s.t0 - cur.t1 < resolution) {
        cur.t1 = Math.max(cur.t1, s.t1);
        cur.n++;
        cur.span = null;
      } else {
        cur = { lane: s.lane, kind: s.kind, t0: s.t0, t1: s.t1, n: 1, span: s };
        bars.push(cur);
      }
    }
  }
  return bars;
}

/**
 * Bars of a SpanStore for a view starting at ``xlo``: full detail from ``xlo`` on, history
 * before it merged at one-pixel resolution (cached until the window or the history changes).
 */
export class WindowedBars {
  constructor() { this._cacheKey = null; this._cached = []; }

  build(store, xlo, plotWidthPx) {
    const inside = [], outside = [];
    for (const s of store.spans()) (s.t1 >= xlo ? inside : outside).push(s);
    const key = `${xlo}|${outside.length}`;
    if (key !== this._cacheKey) {
      this._cached = mergeBars(outside, (xlo - store.tMin) / plotWidthPx);
      this._cacheKey = key;
    }
    const insideRes = inside.length > MAX_DETAILED_BARS ? (store.tMax - xlo) / plotWidthPx : 0;
    return this._cached.concat(mergeBars(inside, insideRes));
  }
}

/** The time range covering the last ``windowSteps`` steps of a store (0 = every step). */
export function windowRange(store, windowSteps) {
  const steps = store.sortedSteps();
  if (!steps.length) return [0, 1];
  const first = windowSteps > 0 && steps.length > windowSteps ? steps[steps.length - windowSteps] : steps[0];
  const lo = Math.min(store.steps.get(first).tStart, store.tMax);
  return [lo, Math.max(store.tMax, lo + 1e-3)];
}

/** Batch barriers: one per step at its optimizer start, [{step, t}], from a SpanStore. */
export function storeBarriers(store) {
  return [...store.steps.entries()]
    .filter(([, info]) => info.optimizerStart !== null)
    .map(([step, info]) => ({ step, t: info.optimizerStart }));
}

/** WebGL draws tens of thousands of bars in one call; without it fall back to SVG (same data). */
const TRACE_TYPE = (() => {
  try { return document.createElement("canvas").getContext("webgl") ? "scattergl" : "scatter"; } catch { return "scatter"; }
})();

/**
 * Plotly figure of bars on lanes. Each kind is one trace of thick line segments
 * [t0, midpoint, t1, gap] on the categorical lane axis: one WebGL draw per kind however many
 * spans (the midpoint vertex lets hover find long bars away from their ends).
 * bars: [{lane, kind, t0, t1, n, span}], lanes: ordered lane names, barriers: [{step, t}],
 * xRange: [lo, hi] or null for autorange, shift: seconds subtracted from every time (compare page).
 */
export function ganttFigure({ bars, lanes, barriers, xRange = null, shift = 0, title = "", showLegend = true, uirevision = "gantt", maxHeight = 900 }) {
  const lanePx = Math.max(4, Math.min(LANE_PX, (maxHeight - 120) / Math.max(lanes.length, 1)));
  const byKind = new Map();
  for (const b of bars) {
    if (!byKind.has(b.kind)) byKind.set(b.kind, { x: [], y: [], text: [] });
    const t = byKind.get(b.kind);
    const a = b.t0 - shift, z = b.t1 - shift;
    const text = b.span ? hoverText(b.span) : `<b>${b.n} × ${b.kind}</b> · ${b.lane}<br>merged: widen the step window to see each span`;
    t.x.push(a, (a + z) / 2, z, null);
    t.y.push(b.lane, b.lane, b.lane, null);
    t.text.push(text, text, text, null);
  }
  const data = orderKinds(byKind.keys()).map((kind, i) => {
    const t = byKind.get(kind);
    return {
      type: TRACE_TYPE, mode: "lines", name: kind, x: t.x, y: t.y, connectgaps: false,
      line: { color: kindColour(kind, i), width: Math.max(2, Math.round(lanePx * 0.7)) },
      hovertext: t.text, hovertemplate: "%{hovertext}<extra></extra>", showlegend: showLegend,
    };
  });
  const shapes = barriers.map((b) => ({
    type: "line", xref: "x", yref: "paper", x0: b.t - shift, x1: b.t - shift, y0: 0, y1: 1,
    line: { color: "#5f6b7c", width: 1, dash: "dash" },
  }));
  const annotations = barriers.map((b) => ({
    xref: "x", yref: "paper", x: b.t - shift, y: 1, yanchor: "bottom", showarrow: false,
    text: `step ${b.step}`, font: { size: 10, color: "#5f6b7c" },
  }));
  const layout = {
    title: title ? { text: title, font: { size: 13 }, x: 0, xanchor: "left" } : undefined,
    height: Math.round(Math.max(240, lanes.length * lanePx + (showLegend ? 160 : 120))),
    margin: { l: 120, r: 20, t: title ? 56 : 36, b: showLegend ? 84 : 44 },
    xaxis: { title: { text: shift ? "seconds since step start" : "seconds since run start" }, zeroline: false,
      ...(xRange ? { range: xRange, autorange: false } : { autorange: true }) },
    yaxis: { type: "category", categoryorder: "array", categoryarray: lanes, autorange: "reversed",
      tickfont: { family: "ui-monospace, monospace", size: 10 }, showgrid: false },
    legend: { orientation: "h", yref: "container", y: 0, yanchor: "bottom", font: { size: 11 } },
    hovermode: "closest", shapes, annotations, uirevision,
    paper_bgcolor: "#fff", plot_bgcolor: "#fff", font: { size: 12 },
  };
  return { data, layout };
}
