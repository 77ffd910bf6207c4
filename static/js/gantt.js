// Gantt chart of spans on a categorical lane axis: plotly for axes, barriers, legend, zoom and
// pan, a 2D canvas for the bars (GanttChart), so tens of thousands of spans redraw in
// milliseconds. Bars too small to see are merged (see mergeBars).
import { kindColour, orderKinds } from "./spans.js";
import { PLOTLY_CONFIG, plotlyLoaded } from "./plots.js";
import { exportConfig } from "./figureexport.js";

const LANE_PX = 16;
// The least row a lane gets, however many: its 10 px label stays legible (the chart grows instead).
const MIN_LANE_PX = 12;
// Above this many bars inside the window, bars are merged at pixel resolution there too.
const MAX_DETAILED_BARS = 40000;

const escapeHtml = (text) => String(text).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);

function fmt(v) { return v === null || v === undefined ? "–" : v; }

/** Hover text of one span, built once per span and cached on it. */
function hoverText(s) {
  if (!s._hover) {
    s._hover = `<b>${escapeHtml(s.kind)}</b> · ${escapeHtml(s.lane)}<br>` +
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

  /** ``coarse``: merge inside the window at pixel resolution too (a page catching up draws less). */
  build(store, xlo, plotWidthPx, { coarse = false } = {}) {
    const inside = [], outside = [];
    for (const s of store.spans()) (s.t1 >= xlo ? inside : outside).push(s);
    const key = `${xlo}|${outside.length}`;
    if (key !== this._cacheKey) {
      this._cached = mergeBars(outside, (xlo - store.tMin) / plotWidthPx);
      this._cacheKey = key;
    }
    const insideRes = coarse || inside.length > MAX_DETAILED_BARS ? (store.tMax - xlo) / plotWidthPx : 0;
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

// A barrier label ("step 12") is ~6 px a character at 10 px; labels closer than this overlap.
const LABEL_GAP_PX = 8;
const labelPx = (step) => 6 * `step ${step}`.length + LABEL_GAP_PX;

/** The time extent the chart autoranges over: the bars' and the barriers' ([lo, hi]). */
function barsExtent(bars, barriers, shift) {
  let lo = Infinity, hi = -Infinity;
  for (const b of bars) { lo = Math.min(lo, b.t0 - shift); hi = Math.max(hi, b.t1 - shift); }
  for (const b of barriers) { lo = Math.min(lo, b.t); hi = Math.max(hi, b.t); }
  return hi > lo ? [lo, hi] : [0, 1];
}

/**
 * The barriers whose "step N" label fits: every dashed line stays, but labels are thinned to the
 * pixels available on the x axis (``range`` over ``widthPx``), the newest step always labelled and
 * older ones kept while they do not touch the label to their right.
 */
export function barrierLabels(barriers, range, widthPx) {
  const [lo, hi] = range, scale = widthPx / Math.max(hi - lo, 1e-9);
  const inView = barriers.filter((b) => b.t >= lo && b.t <= hi).sort((a, b) => b.t - a.t);
  const kept = [];
  let leftEdge = Infinity; // of the last kept label, in px
  for (const b of inView) {
    const x = (b.t - lo) * scale, half = labelPx(b.step) / 2;
    if (x + half <= leftEdge) { kept.push(b); leftEdge = x - half; }
  }
  return kept.reverse();
}

/** Legend entries and lane axis as plotly traces; the bars themselves are not plotly data. */
function axisTraces(bars, lanes, kinds, shift, showLegend, lanePx) {
  let lo = Infinity, hi = -Infinity;
  for (const b of bars) { lo = Math.min(lo, b.t0 - shift); hi = Math.max(hi, b.t1 - shift); }
  if (!(hi >= lo)) { lo = 0; hi = 1; }
  const legend = orderKinds(kinds).map((kind, i) => ({
    type: "scatter", mode: "lines", name: kind, x: [null], y: [null], showlegend: showLegend,
    line: { color: kindColour(kind, i), width: Math.max(2, Math.round(lanePx * 0.7)) }, hoverinfo: "skip",
  }));
  // One invisible point per lane puts every lane on the category axis, and the first and last
  // lane's points span the bars' time extent so that autorange covers them.
  const axis = {
    type: "scatter", mode: "markers", x: lanes.map((_, i) => (i === lanes.length - 1 ? hi : lo)), y: lanes,
    marker: { opacity: 0, size: 1 }, hoverinfo: "skip", showlegend: false, name: "",
  };
  return [...legend, axis];
}

/**
 * Plotly figure of a Gantt without its bars (GanttChart paints them): axes with one category
 * per lane, the legend of kinds, batch barriers as dashed lines labelled with their step.
 * bars: [{lane, kind, t0, t1, n, span}], lanes: ordered lane names, barriers: [{step, t}],
 * xRange: [lo, hi] or null for autorange, shift: seconds subtracted from every time (compare page).
 */
export function ganttFigure({ bars, lanes, barriers, xRange = null, yRange = null, shift = 0, title = "", showLegend = true, uirevision = "gantt", maxHeight = 900, plotWidthPx = 800 }) {
  barriers = barriers.map((b) => ({ ...b, t: b.t - shift })); // on the figure's axis from here on
  const lanePx = Math.max(MIN_LANE_PX, Math.min(LANE_PX, (maxHeight - 120) / Math.max(lanes.length, 1)));
  const kinds = new Set(bars.map((b) => b.kind));
  const shapes = barriers.map((b) => ({
    type: "line", xref: "x", yref: "paper", x0: b.t, x1: b.t, y0: 0, y1: 1,
    line: { color: "#5f6b7c", width: 1, dash: "dash" },
  }));
  const annotations = barrierLabels(barriers, xRange ?? barsExtent(bars, barriers, shift), plotWidthPx).map((b) => ({
    xref: "x", yref: "paper", x: b.t, y: 1, yanchor: "bottom", showarrow: false,
    text: `step ${b.step}`, font: { size: 10, color: "#5f6b7c" },
  }));
  const layout = {
    title: title ? { text: title, font: { size: 13 }, x: 0, xanchor: "left" } : undefined,
    height: Math.round(Math.max(240, lanes.length * lanePx + (showLegend ? 160 : 120))),
    margin: { l: Math.max(120, Math.min(280, 24 + 6.2 * Math.max(0, ...lanes.map((l) => l.length)))), r: 20, t: title ? 56 : 36, b: showLegend ? 84 : 44 },
    xaxis: { title: { text: shift ? "seconds since step start" : "seconds since run start" }, zeroline: false,
      ...(xRange ? { range: xRange, autorange: false } : { autorange: true }) },
    // every lane labelled (tickvals): plotly would otherwise thin a crowded category axis and
    // could drop learner/0's label
    yaxis: { type: "category", categoryorder: "array", categoryarray: lanes,
      // autorange exactly over the lanes: plotly pads a scatter axis by 5% each way, which at 257
      // lanes left 14 empty rows (~150 px) above learner/0 and shrank every row to 11 px
      ...(yRange ? { range: yRange, autorange: false }
        : { autorange: "reversed", autorangeoptions: { minallowed: -0.5, maxallowed: Math.max(lanes.length, 1) - 0.5 } }),
      tickmode: "array", tickvals: lanes, ticktext: lanes,
      tickfont: { family: "ui-monospace, monospace", size: 10 }, showgrid: false, fixedrange: false },
    legend: { orientation: "h", yref: "container", y: 0, yanchor: "bottom", font: { size: 11 } },
    hovermode: false, shapes, annotations, uirevision,
    paper_bgcolor: "#fff", plot_bgcolor: "#fff", font: { size: 12 },
  };
  return { data: axisTraces(bars, lanes, kinds, shift, showLegend, lanePx), layout };
}

/** Pixel position of a linear axis value, for the axis range ``range`` over ``len`` pixels. */
function axisToPx(range, len, vertical) {
  const [r0, r1] = range, scale = len / (r1 - r0);
  return vertical ? (v) => (r1 - v) * scale : (v) => (v - r0) * scale;
}

const HOVER_PX = 3;
const FOLDED_ALPHA = 0.3;

/**
 * A Gantt chart: plotly draws axes, barriers, legend and handles zoom and pan; the bars are
 * painted on a 2D canvas laid between plotly's plot layer and its top layer, and hover is
 * looked up per lane by time. Painting tens of thousands of rectangles this way costs a few
 * milliseconds, where plotly's WebGL lines cost seconds per redraw on software WebGL (no GPU)
 * and its SVG lines hundreds of milliseconds of script.
 */
export class GanttChart {
  constructor(div) {
    this.div = div;
    this.canvas = document.createElement("canvas");
    this.canvas.className = "gantt-bars";
    this.tip = document.createElement("div");
    this.tip.className = "gantt-tip";
    this.tip.hidden = true;
    this.bars = [];
    this.shift = 0;
    this.byKind = new Map(); // kind -> bars, painted one fill per kind
    this.byLane = new Map(); // lane -> bars sorted by t0, for hover
    this.listening = false;
    this.handlers = []; // [event, fn] for plotly events, attached once the div is a plotly graph
    // Drawn over the bars after each paint, e.g. a selected trajectory (static/js/trajectory.js):
    // {dim: bool, paint(ctx, geometry)}; ``dim`` paints every other bar faded.
    this.overlay = null;
    // (span) -> a line of text explaining it, added to its hover (e.g. an unusually long optimizer)
    this.describe = null;
  }

  /** Listens to a plotly event of the chart (e.g. "plotly_relayout"), now or after the first draw. */
  on(event, fn) {
    this.handlers.push([event, fn]);
    if (this.listening) this.div.on(event, fn);
  }

  /** Counts of drawn bars per kind (merged bars count once). */
  barsByKind() {
    return Object.fromEntries([...this.byKind].map(([kind, list]) => [kind, list.length]));
  }

  async draw({ bars, ...options }) {
    // the x axis' pixels, for thinning the barrier labels: the plot area once drawn, else the
    // div less the widest lane margin
    const plotWidthPx = this.div._fullLayout?.xaxis?._length ?? Math.max(300, this.div.clientWidth - 300);
    const figure = ganttFigure({ bars, plotWidthPx, ...options });
    this.shift = options.shift ?? 0;
    this.setBars(bars);
    this.painted = false;
    this.tip.hidden = true; // the bar under a still pointer may be gone
    await plotlyLoaded;
    await Plotly.react(this.div, figure.data, figure.layout, exportConfig(PLOTLY_CONFIG, this));
    this.div.style.minHeight = "0"; // the figure's height is the chart's: no blank band below it
    this.listen();
    if (!this.painted) this.paint();
  }

  /** An empty chart with a centred note, e.g. before the first spans arrive. */
  async note(text) {
    this.setBars([]);
    this.tip.hidden = true;
    const { data, layout } = ganttFigure({ bars: [], lanes: [], barriers: [] });
    layout.annotations = [{ text, showarrow: false, xref: "paper", yref: "paper", x: 0.5, y: 0.5, font: { color: "#5f6b7c", size: 14 } }];
    layout.xaxis.visible = false;
    layout.yaxis.visible = false;
    await plotlyLoaded;
    await Plotly.react(this.div, data, layout, PLOTLY_CONFIG);
    this.listen();
    this.paint();
  }

  setBars(bars) {
    this.bars = bars;
    this.byKind = new Map();
    this.byLane = new Map();
    for (const b of bars) {
      if (!this.byKind.has(b.kind)) this.byKind.set(b.kind, []);
      this.byKind.get(b.kind).push(b);
      if (!this.byLane.has(b.lane)) this.byLane.set(b.lane, []);
      this.byLane.get(b.lane).push(b);
    }
    for (const list of this.byLane.values()) list.sort((a, b) => a.t0 - b.t0);
  }

  listen() {
    if (this.listening) return;
    this.listening = true;
    // Replots after zoom, pan, resize and legend clicks; during a drag, plotly reports the
    // ranges in progress, so the bars move with the axes.
    this.div.on("plotly_afterplot", () => this.paint());
    this.div.on("plotly_restyle", () => this.paint());
    this.div.on("plotly_relayouting", (ev) => this.paint(ev));
    for (const [event, fn] of this.handlers) this.div.on(event, fn);
    this.div.addEventListener("mousemove", (ev) => this.hover(ev));
    this.div.addEventListener("mouseleave", () => { this.tip.hidden = true; });
  }

  /** Axis range of ``name`` ("xaxis"/"yaxis"), from a drag in progress when there is one. */
  range(name, dragging) {
    const ax = this.div._fullLayout[name];
    const lo = dragging?.[`${name}.range[0]`], hi = dragging?.[`${name}.range[1]`];
    return lo !== undefined && hi !== undefined ? [ax.r2l(lo), ax.r2l(hi)] : ax.range.map((v) => ax.r2l(v));
  }

  /** The plot area in the figure's pixels (where the canvas lies). */
  plotArea() {
    const xa = this.div._fullLayout.xaxis, ya = this.div._fullLayout.yaxis;
    return { left: xa._offset, top: ya._offset, width: xa._length, height: ya._length };
  }

  /**
   * Every visible bar as plot-area rectangles, one list per kind in legend order:
   * {left, top, width, height, px, py, laneY, thickness, kinds: [{kind, colour, alpha, rects: [[x, y, w, h]]}]}
   * for the current axis ranges (or those of a drag in progress). The canvas paint and the SVG
   * export both draw these.
   */
  barRects(dragging = null) {
    const layout = this.div._fullLayout, ya = layout.yaxis;
    const area = this.plotArea(), w = area.width, h = area.height;
    const px = axisToPx(this.range("xaxis", dragging), w, false);
    const py = axisToPx(this.range("yaxis", dragging), h, true);
    const laneY = new Map([...this.byLane.keys()].map((lane) => [lane, py(ya.d2l(lane))]));
    const thickness = Math.max(1, Math.abs(py(1) - py(0)) * 0.7);
    const hidden = new Set((this.div._fullData || []).filter((t) => t.visible === "legendonly").map((t) => t.name));
    const dim = this.overlay?.dim ? 0.22 : 1;
    const kinds = orderKinds(this.byKind.keys()).flatMap((kind, i) => {
      const rects = [], folded = [];
      if (!hidden.has(kind)) {
        for (const b of this.byKind.get(kind)) {
          const x0 = px(b.t0 - this.shift), x1 = px(b.t1 - this.shift), y = laneY.get(b.lane);
          if (x1 < 0 || x0 > w || y < -thickness || y > h + thickness) continue;
          // A span shorter than a pixel still gets one pixel, as a line would.
          (b.folded ? folded : rects).push([x0, y - thickness / 2, Math.max(1, x1 - x0), thickness]);
        }
      }
      const colour = kindColour(kind, i);
      // folded lanes share a band: translucent bars add up to the band's occupancy
      return [{ kind, colour, alpha: dim, rects }, ...(folded.length ? [{ kind, colour, alpha: dim * FOLDED_ALPHA, rects: folded }] : [])];
    });
    return { ...area, px, py, laneY, thickness, kinds };
  }

  /** Paints every bar in the current axis ranges (or those of a drag in progress). */
  paint(dragging = null) {
    this.painted = true;
    const layout = this.div._fullLayout;
    if (!layout || !layout.xaxis) return;
    const container = this.div.querySelector(".svg-container");
    const top = container && container.querySelectorAll(":scope > svg.main-svg")[1];
    if (!top) return;
    // Between plotly's plot layer (grid, axes) and its top layer (barriers, legend, hover).
    if (this.canvas.nextSibling !== top) container.insertBefore(this.canvas, top);
    if (this.tip.parentNode !== container) container.appendChild(this.tip);
    const geometry = this.barRects(dragging);
    const { left, top: y0, width: w, height: h } = geometry, dpr = window.devicePixelRatio || 1;
    Object.assign(this.canvas.style, { left: `${left}px`, top: `${y0}px`, width: `${w}px`, height: `${h}px` });
    if (this.canvas.width !== Math.round(w * dpr) || this.canvas.height !== Math.round(h * dpr)) {
      this.canvas.width = Math.round(w * dpr);
      this.canvas.height = Math.round(h * dpr);
    }
    const ctx = this.canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, w, h);
    for (const { colour, alpha, rects } of geometry.kinds) {
      ctx.globalAlpha = alpha;
      ctx.fillStyle = colour;
      ctx.beginPath();
      for (const [x, y, rw, rh] of rects) ctx.rect(x, y, rw, rh);
      ctx.fill();
    }
    ctx.globalAlpha = 1;
    const x = (t) => geometry.px(t - this.shift);
    const colours = new Map(geometry.kinds.map((k) => [k.kind, k.colour]));
    this.overlay?.paint(ctx, { x, laneY: geometry.laneY, thickness: geometry.thickness, width: w, height: h,
      colour: (kind) => colours.get(kind) ?? kindColour(kind) });
  }

  /** The bar under a mouse event (lane from y, time from x within HOVER_PX), or null. */
  barAtEvent(ev) {
    const layout = this.div._fullLayout;
    if (!layout || !layout.xaxis || !this.bars.length) return null;
    const box = this.canvas.getBoundingClientRect();
    const x = ev.clientX - box.left, y = ev.clientY - box.top;
    if (x < 0 || y < 0 || x > box.width || y > box.height) return null;
    const xa = layout.xaxis, ya = layout.yaxis;
    return this.barAt(ya.p2l(y), xa.p2l(x) + this.shift, HOVER_PX * Math.abs(xa.p2l(1) - xa.p2l(0)), ya);
  }

  /** The bar under the pointer, shown in a tooltip. */
  hover(ev) {
    const bar = this.barAtEvent(ev);
    if (!bar) { this.tip.hidden = true; return; }
    const more = bar.span && this.describe ? this.describe(bar.span) : "";
    this.tip.innerHTML = bar.span ? hoverText(bar.span) + (more ? `<br>${escapeHtml(more)}` : "")
      : `<b>${bar.n} × ${escapeHtml(bar.kind)}</b> · ${escapeHtml(bar.lane)}<br>merged: widen the step window to see each span`;
    const host = this.tip.parentNode.getBoundingClientRect();
    Object.assign(this.tip.style, { left: `${ev.clientX - host.left + 12}px`, top: `${ev.clientY - host.top + 12}px` });
    this.tip.hidden = false;
  }

  barAt(laneValue, t, tolerance, ya) {
    const lane = ya._categories[Math.round(laneValue)];
    const list = lane === undefined ? null : this.byLane.get(lane);
    if (!list) return null;
    // Last bar starting at or before t + tolerance; bars of one lane rarely overlap, so the
    // nearest candidates are just before it.
    let lo = 0, hi = list.length;
    while (lo < hi) { const mid = (lo + hi) >> 1; if (list[mid].t0 <= t + tolerance) lo = mid + 1; else hi = mid; }
    let best = null, bestGap = Infinity;
    for (let i = lo - 1; i >= 0 && i >= lo - 64; i--) {
      const b = list[i], gap = t < b.t0 ? b.t0 - t : t > b.t1 ? t - b.t1 : 0;
      if (gap <= tolerance && gap < bestGap) { best = b; bestGap = gap; }
    }
    return best;
  }
}
