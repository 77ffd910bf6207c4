// Compare page: hand-picked runs or a comparison's every run side by side, all figures from the
// JSON API (metrics and spans). The tables hold every run; the per-run charts and timelines draw at
// most CHART_RUNS of them (round-robin over the schedules, so every schedule is drawn).
import { SpanStore, orderLanes } from "./spans.js";
import { GanttChart, storeBarriers, mergeBars } from "./gantt.js";
import { drawFigure, metricSeries, seriesFigure } from "./plots.js";
import { fetchSpans, getJSON } from "./fetchjson.js";
import { drawSummary } from "./summary.js";
import { drawPooled } from "./pooled.js";
import { MetricPanel, metricPoints } from "./metricpanel.js";
import { METRIC } from "./conventions.js";
import { drawSweep } from "./sweepplot.js";

const RUN_COLOURS = ["#4c78a8", "#e15759", "#59a14f", "#b07aa1", "#f28e2b", "#76b7b2", "#edc948", "#9c755f",
  "#ff9da7", "#bab0ac", "#1f77b4", "#8c564b"];
const CHART_RUNS = 8; // runs per chart: more lines than this are unreadable
const TIMELINE_PX = 1100; // merge resolution of the small multiples: about one pixel

const FINISHED = new Set(["succeeded", "failed", "cancelled"]);
const LIVE_POLL_MS = 3000; // while a run trains, the page re-reads metrics and the summary

const runs = [...document.querySelectorAll("#compare-runs li")].map((li) => ({
  id: Number(li.dataset.runId), name: li.dataset.name, schedule: li.dataset.schedule, status: li.dataset.status,
  apiBase: li.dataset.apiBase, sweepValue: li.dataset.sweepValue ? JSON.parse(li.dataset.sweepValue) : null,
  metrics: [], stepSpans: new Map(), // step -> spans
}));
const $ = (id) => document.getElementById(id);

/** The runs the charts draw: all of them up to CHART_RUNS, else the first run of every schedule
 * (and sweep value), then the second of each, ... in page order. */
function chartedRuns(all) {
  if (all.length <= CHART_RUNS) return all;
  const groups = new Map();
  for (const r of all) {
    const key = `${r.schedule}|${JSON.stringify(r.sweepValue)}`;
    groups.set(key, [...(groups.get(key) ?? []), r]);
  }
  const picked = new Set();
  for (let k = 0; picked.size < CHART_RUNS; k++) {
    const round = [...groups.values()].map((g) => g[k]).filter(Boolean);
    if (!round.length) break;
    for (const r of round) if (picked.size < CHART_RUNS) picked.add(r);
  }
  return all.filter((r) => picked.has(r));
}
const charted = chartedRuns(runs);
charted.forEach((r, i) => { r.colour = RUN_COLOURS[i % RUN_COLOURS.length]; });
if (charted.length < runs.length) {
  $("chart-note").hidden = false;
  $("chart-note").textContent = `The charts and timelines below draw ${charted.length} of these ${runs.length} runs `
    + "(the first rounds of every schedule); this table and the pooled one hold every run.";
}
const stepSelect = $("compare-step");
const label = (run) => `${run.name} (${run.schedule})`;

/** Spans of ``run`` for steps [lo, hi], fetched once per step and cached. */
async function loadSteps(run, lo, hi) {
  const missing = [];
  for (let s = lo; s <= hi; s++) if (!run.stepSpans.has(s)) missing.push(s);
  if (missing.length) {
    const spans = await fetchSpans(run.apiBase, Math.min(...missing), Math.max(...missing));
    for (const s of missing) run.stepSpans.set(s, []);
    for (const span of spans) run.stepSpans.get(span.step)?.push(span);
  }
  const out = [];
  for (let s = lo; s <= hi; s++) out.push(...run.stepSpans.get(s));
  return out;
}

function drawMetricCharts() {
  const per = (key, scale = 1) => charted.map((r) => ({ name: label(r), colour: r.colour, ...metricSeries(r.metrics, key, scale) }));
  drawFigure($("chart-step-time"), seriesFigure(per(METRIC.STEP_S), { kind: "bar", yTitle: "seconds" }));
  drawFigure($("chart-idle"), seriesFigure(per(METRIC.TRAINER_IDLE, 100), { kind: "bar", yTitle: "learner idle %", yRange: [0, 100] }));
}

/**
 * The figure's legend under its plot (below the x axis title), the figure taller by the rows its
 * ``names`` take at the chart's width (~6.5 px a character and 40 px of swatch a name), so that
 * however many runs it names it covers none of the plot.
 */
function belowLegend(figure, chart, names) {
  const width = Math.max(300, chart.clientWidth || 800);
  let rows = 1, used = 0;
  for (const name of names) {
    const px = 40 + 6.5 * name.length;
    if (used && used + px > width) { rows++; used = 0; }
    used += px;
  }
  const legendPx = rows * 20 + 8;
  figure.layout.legend = { ...figure.layout.legend, orientation: "h", yref: "container", y: 0, yanchor: "bottom", x: 0 };
  figure.layout.margin = { ...figure.layout.margin, b: 44 + legendPx };
  figure.layout.height = (figure.layout.height ?? 260) + legendPx;
}

/**
 * Reward against wall time: each step's reward when the step ended, from the run's first step
 * start, so no run carries its boot time (the summary's origin): raw (faint) and smoothed as the
 * summary reads it (solid); ``levels``, the summary's reward levels, as dotted lines.
 */
function drawReward(levels, smoothing) {
  const reward = charted.flatMap((r) => [
    { name: `${label(r)} raw`, colour: r.colour, opacity: 0.3, ...metricPoints(r.metrics, METRIC.REWARD_MEAN, { axis: "wall" }) },
    { name: `${label(r)} EMA ${smoothing}`, colour: r.colour, ...metricPoints(r.metrics, METRIC.REWARD_MEAN, { axis: "wall", smoothing }) },
  ]);
  const figure = seriesFigure(reward, { xTitle: "seconds since the first step started", yTitle: METRIC.REWARD_MEAN });
  // one legend entry per run (its raw line shares the entry: a click hides both), below the plot
  // with room for its rows: 16 entries above the plot once covered all but ~80 px of it
  figure.data.forEach((trace, i) => { trace.legendgroup = `run-${i >> 1}`; if (i % 2 === 0) trace.showlegend = false; });
  belowLegend(figure, $("chart-reward"), charted.map((r) => `${label(r)} EMA ${smoothing}`));
  figure.layout.shapes = levels.map((level) => (
    { type: "line", xref: "paper", x0: 0, x1: 1, y0: level, y1: level, line: { color: "#5f6b7c", dash: "dot", width: 1 } }));
  return drawFigure($("chart-reward"), figure);
}

/**
 * Staleness of the trained turns over every step of the run, from the learner's per-step
 * histogram (``staleness/turns_<k>``: turns trained k versions after they were sampled;
 * docs/schedules.md defines staleness once, the page only adds the counts up): the same turns
 * as the summary's staleness mean.
 */
function stalenessCounts(metrics) {
  const counts = new Map();
  for (const m of metrics) {
    for (const [name, n] of Object.entries(m.values)) {
      if (name.startsWith(METRIC.STALENESS_TURNS) && typeof n === "number") {
        const k = Number(name.slice(METRIC.STALENESS_TURNS.length));
        counts.set(k, (counts.get(k) ?? 0) + n);
      }
    }
  }
  return counts;
}

function drawStaleness() {
  const series = charted.map((r) => {
    const counts = stalenessCounts(r.metrics);
    const x = [...counts.keys()].sort((a, b) => a - b);
    return { name: label(r), colour: r.colour, x, y: x.map((v) => counts.get(v)) };
  });
  const figure = seriesFigure(series, { kind: "bar", xTitle: "staleness (policy versions)", yTitle: "turns" });
  figure.layout.xaxis = { ...figure.layout.xaxis, dtick: 1, tickformat: "d" };
  drawFigure($("chart-staleness"), figure, "No trained turns recorded.");
}

/** One Gantt per run for ``step``, times relative to that run's step start, one shared x range. */
async function drawTimelines(step) {
  const container = $("timelines");
  const per = await Promise.all(charted.map(async (r) => {
    const store = new SpanStore();
    store.add(await loadSteps(r, step, step));
    const metric = r.metrics.find((m) => m.step === step);
    const start = metric?.values[METRIC.T_START] ?? store.steps.get(step)?.tStart ?? 0;
    return { run: r, store, start };
  }));
  // Off-policy rollouts of this step's batch ran before the step started: negative times, shown.
  const width = Math.max(1e-3, ...per.map((p) => (p.store.size ? p.store.tMax - p.start : 0)));
  const before = Math.min(0, ...per.map((p) => (p.store.size ? p.store.tMin - p.start : 0)));
  container.replaceChildren();
  per.forEach((p, i) => {
    const div = document.createElement("div");
    div.className = "chart gantt";
    div.id = `timeline-${p.run.id}`;
    container.appendChild(div);
    if (!p.store.size) {
      const empty = document.createElement("p"); // textContent: a run name is user input
      empty.className = "empty";
      empty.textContent = `${label(p.run)}: no spans for step ${step}.`;
      div.replaceChildren(empty);
      return;
    }
    const bars = mergeBars([...p.store.spans()], width / TIMELINE_PX);
    new GanttChart(div).draw({
      bars, lanes: orderLanes(p.store.lanes), barriers: storeBarriers(p.store), shift: p.start,
      xRange: [before - (width - before) * 0.01, width + (width - before) * 0.02], title: `${label(p.run)} · step ${step} · ${p.store.size} spans`,
      showLegend: i === per.length - 1, maxHeight: 420, uirevision: `step-${step}`,
    });
  });
  container.dataset.step = String(step);
}

/** A sweep's figure against its swept value (static/js/sweepplot.js), from the latest summary. */
let lastSummary = null;
const sweepPanel = $("sweep-panel");
function drawSweepPanel() {
  if (!sweepPanel || !lastSummary) return null;
  return drawSweep($("chart-sweep"), runs, lastSummary, $("sweep-metric").value, sweepPanel.dataset.field);
}
$("sweep-metric")?.addEventListener("change", () => drawSweepPanel()?.catch(showError));

/** The summary and the reward chart, redrawn when the level or the smoothing changes; the input
 * shows the level in use (the API's default until the user types one). Returns the redraw. */
function watchSummary() {
  const input = $("reward-level"), smoothing = $("reward-smoothing");
  let chosen = null;
  const draw = async () => {
    const summary = await drawSummary($("compare-summary"), $("summary-note"), $("reward-note"), $("compare-warnings"),
      runs.map((r) => r.id), chosen, Number(smoothing.value), $("compare-app").dataset.summaryUrl);
    if (chosen === null) input.value = summary.reward_level === null ? "" : String(Number(summary.reward_level.toFixed(4)));
    drawPooled($("pooled-panel"), $("compare-pooled"), $("trained-warnings"), summary);
    lastSummary = summary;
    await drawReward(summary.reward_levels ?? [], summary.reward_smoothing);
    await drawSweepPanel();
  };
  input.addEventListener("change", () => {
    chosen = input.value.trim() === "" ? null : Number(input.value);
    draw().catch(showError);
  });
  smoothing.addEventListener("change", () => draw().catch(showError));
  return draw;
}

async function load() {
  await Promise.all(runs.map(async (r) => {
    const [metrics, detail] = await Promise.all([getJSON(`${r.apiBase}metrics/`), getJSON(r.apiBase)]);
    r.metrics = metrics.metrics;
    r.status = detail.status;
    // the picker above was rendered with the status at page load ("starting" for a run that has
    // finished since): it follows the live poll
    const shown = document.querySelector(`[data-picker-status="${r.id}"]`);
    if (shown) shown.textContent = r.status;
  }));
}

/** Steps every run has finished: the aligned timelines compare like with like. The newest is
 * shown until the user picks one. */
let pickedStep = null;
async function drawCommonSteps() {
  const common = charted.map((r) => new Set(r.metrics.map((m) => m.step)))
    .reduce((a, b) => new Set([...a].filter((s) => b.has(s))));
  const steps = [...common].sort((a, b) => a - b);
  const shown = pickedStep ?? steps[steps.length - 1];
  if (steps.length !== stepSelect.options.length) stepSelect.replaceChildren(...steps.map((s) => new Option(`step ${s}`, String(s))));
  if (!steps.length) {
    $("timelines").innerHTML = '<p class="empty">These runs have no step in common yet.</p>';
  } else if ($("timelines").dataset.step !== String(shown)) {
    stepSelect.value = String(shown);
    await drawTimelines(shown);
  }
}

/** "live: 2 of 3 runs training" while any run has not finished; polls until they all have. */
function liveNote() {
  const open = runs.filter((r) => !FINISHED.has(r.status));
  $("live-note").textContent = open.length
    ? `live: ${open.map((r) => `${r.name} ${r.status}, ${r.metrics.length} steps`).join(" · ")}; refreshed every ${LIVE_POLL_MS / 1000} s`
    : "";
  document.getElementById("compare-app").dataset.live = open.length ? "1" : "0";
  return open.length > 0;
}

async function main() {
  await load();
  const drawSummaryAndReward = watchSummary();
  const panel = new MetricPanel($("metric-panel"));
  const redraw = async () => {
    await drawSummaryAndReward();
    await panel.update(charted.map((r) => ({ name: label(r), colour: r.colour, metrics: r.metrics })));
    drawMetricCharts();
    await drawCommonSteps();
    await drawStaleness();
  };
  await redraw();
  stepSelect.addEventListener("change", () => { pickedStep = Number(stepSelect.value); drawTimelines(pickedStep); });
  document.getElementById("compare-app").dataset.ready = "1";
  while (liveNote()) {
    await new Promise((resolve) => setTimeout(resolve, LIVE_POLL_MS));
    await load();
    await redraw();
  }
}

function showError(err) {
  const box = document.createElement("div");
  box.className = "error-box";
  box.textContent = `Could not load the comparison: ${err.message}`;
  document.getElementById("compare-app").prepend(box);
}

main().catch(showError);
