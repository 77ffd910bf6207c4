// Live run page: websocket client (replay after the last seq held, then live frames), the Gantt of
// spans and the per-step metric charts. Protocol: docs/web-contract.md, "Websocket".
import { SpanStore, orderLanes } from "./spans.js";
import { GanttChart, WindowedBars, storeBarriers, windowRange } from "./gantt.js";
import { DrawBudget, drawFigure, metricSeries, seriesFigure, throttledRedraw } from "./plots.js";
import { OnScreen } from "./onscreen.js";
import { MetricPanel } from "./metricpanel.js";
import { TrajectorySelection } from "./trajectory.js";
import { trajectoryView, StepPicker } from "./bytraj.js";
import { KIND, METRIC } from "./conventions.js";
import { readableLog } from "./logview.js";
import { foldLanes, zoomedLanes } from "./lanefold.js";
import { TrajectoryTable, trajectoryRows } from "./trajtable.js";
import { TrajectoryRecords, renderTrajectoryText } from "./trajrecords.js";
import { processFigure } from "./processchart.js";

const TERMINAL = new Set(["finished", "succeeded", "done", "failed", "cancelled", "canceled"]);
const MAX_RETRY_MS = 5000;
// The server accepts, then closes with these codes (docs/web-contract.md): retrying cannot help.
const FINAL_CLOSES = {
  4401: "Your session has expired: log in again to follow this run.",
  4404: "This run no longer exists or is not yours.",
  4400: "The page asked for a malformed replay cursor: reload the page.",
  4429: "Too many live views of your runs are open: close some tabs or windows, then reload this page.",
};

const root = document.getElementById("run-app");
const $ = (id) => document.getElementById(id);
const el = {
  badge: $("status-badge"), conn: $("conn"), error: $("error-box"), cancel: $("cancel-form"), resume: $("resume-form"),
  idleLive: $("idle-live"), idleLiveHint: $("idle-live-hint"), idleLast: $("idle-last"),
  stepTime: $("step-time"), reward: $("reward"), staleness: $("staleness"),
  spansDrawn: $("spans-drawn"), barsHint: $("bars-hint"),
  windowSteps: $("window-steps"), follow: $("follow"), gantt: $("gantt"), laneMode: $("lane-mode"), foldLanes: $("fold-lanes"),
  chartIdle: $("chart-idle"), chartStepTime: $("chart-step-time"),
  chartReward: $("chart-reward"), chartStaleness: $("chart-staleness"),
  progress: $("progress"), log: $("log-tail"),
};

const store = new SpanStore();
const bars = new WindowedBars();
const gantt = new GanttChart(el.gantt);
const selection = new TrajectorySelection(gantt, { search: $("traj-search"), detail: $("traj-detail"), note: $("traj-note"),
  learnt: (step) => learntIn(step) });
const trajSteps = new StepPicker($("traj-step"));
const trajTable = new TrajectoryTable($("traj-table"), (traj) => selection.select(traj));
const trajRecords = new TrajectoryRecords(root.dataset.apiBase, () => {
  if (el.laneMode.value === "traj") requestGantt({ now: true });
});
selection.onRender = (traj, state) => showTrajectoryText(traj, state);
let shownText = { traj: null, state: null, record: null }; // what #traj-text shows

/** The selected trajectory's decoded text and facts in #traj-text (fetched once per trajectory). */
async function showTrajectoryText(traj, state) {
  const box = $("traj-text");
  if (traj === null) {
    box.hidden = true;
    box.dataset.traj = "";
    shownText = { traj: null, state: null, record: null };
    return;
  }
  if (shownText.traj === traj && shownText.record) {
    if (shownText.state !== state) renderTrajectoryText(box, shownText.record, state);
    shownText.state = state;
    return;
  }
  shownText = { traj, state, record: null };
  try {
    const record = await trajRecords.detail(traj);
    if (selection.traj !== traj) return;
    shownText = { traj, state: selection.note.dataset.state, record };
    renderTrajectoryText(box, record, shownText.state);
  } catch {
    if (selection.traj !== traj) return;
    box.textContent = `No text recorded for trajectory ${traj} yet: the learner records a step's trajectories after the step.`;
    box.dataset.traj = `missing-${traj}`;
    box.hidden = false;
  }
}
gantt.describe = (span) => (span.kind === KIND.OPTIMIZER ? optimizerNote(span) : "");
const metrics = new Map(); // step -> values
const systemSamples = new Map(); // "node@t" -> {t, node, values}: the processes on the wall clock
// Debug flag (docs/pages.md, "Debug flag"): only when window.THUNDERSYNC_DEBUG is set before the
// page loads (the browser tests and web benches set it) does the page log frame and draw timings
// and expose window.__thundersync; a production page does neither.
const DEBUG = window.THUNDERSYNC_DEBUG === true;
const frameLog = []; // per spans frame: {n, firstSeq, lastSeq, recvMs, drawnMs}; read by bench/web/web_latency.py
const drawLog = []; // per Gantt redraw: {startMs, builtMs, endMs, bars}; read by bench/web/web_render.py
let status = root.dataset.status;
let ws = null, connects = 0, retryMs = 500, replayDone = false, connectedMs = 0;
let spansDrawn = 0, barsDrawn = 0, draws = 0, chartsDrawnMs = null;
let followEpoch = 0; // bumping it tells plotly to drop the user's zoom and follow again
const totalSteps = Number(root.dataset.steps);
const parseTime = (iso) => (iso ? Date.parse(iso) : null);
let startedMs = parseTime(root.dataset.started), finishedMs = parseTime(root.dataset.finished);
const closeCodes = []; // of every socket close, for the browser tests (4408: too slow, resumed)
const logLines = new Map(); // line number in the learner's log -> text (the last LOG_KEEP lines)
const LOG_KEEP = 200;

const epochMs = () => performance.timeOrigin + performance.now();
const pct = (v) => (v === null || v === undefined ? "—" : `${(100 * v).toFixed(1)}%`);
const num = (v, digits = 2) => (v === undefined || v === null ? "—" : Number(v).toFixed(digits));

/** What the learner did with a step's trajectories, for one without a backward: the step is
 * done (its metrics exist), the run has ended, how many it skipped (learner/skipped_trajectories). */
function learntIn(step) {
  const values = metrics.get(step);
  return { done: values !== undefined, ended: TERMINAL.has(status), skipped: values?.[METRIC.SKIPPED_TRAJECTORIES] ?? null };
}

/**
 * What an optimizer span holds: the whole barrier of its step (the learner's sampled-version
 * checks, the engine-vs-learner log-prob check over the step's mismatch/tokens, gradient
 * clipping, the optimizer step: learner/driver/barrier.py), and how it compares with the run's
 * median optimizer span, so a long one is not a mystery.
 */
function optimizerNote(span) {
  const durations = store.learnerSpans.filter((s) => s.kind === KIND.OPTIMIZER).map((s) => s.t1 - s.t0).sort((a, b) => a - b);
  const median = durations[Math.floor(durations.length / 2)] ?? 0, took = span.t1 - span.t0;
  const tokens = metrics.get(span.step)?.[METRIC.MISMATCH_TOKENS];
  const check = tokens === undefined ? "the log-prob check" : `the log-prob check over ${tokens} tokens (mismatch/tokens)`;
  const ratio = median > 0 ? ` · ${(took / median).toFixed(1)}× the run's median optimizer span (${(median * 1000).toFixed(1)} ms)` : "";
  return `the step's barrier: version checks, ${check}, gradient clipping, the optimizer step${ratio}`;
}

// ---- Gantt -------------------------------------------------------------------------------
/** What the Gantt shows: rollout-slot lanes over the last K steps, or one step by trajectory. */
function ganttView() {
  if (el.laneMode.value === "traj") {
    const step = trajSteps.pick(store.sortedSteps());
    const view = trajectoryView(store, step, metrics.has(step));
    const barriers = storeBarriers(store).filter((b) => b.step === step);
    lanesShown = null;
    trajTable.show(trajectoryRows(view.spans, view.trajs, metrics.has(step), trajRecords.step(step)));
    return { ...view, barriers, lo: view.range[0], hi: view.range[1], key: `traj-${step}` };
  }
  const [lo, hi] = windowRange(store, Number(el.windowSteps.value));
  const plotPx = Math.max(300, el.gantt.clientWidth - 140);
  trajTable.show([]);
  const lanes = orderLanes(store.lanes), built = bars.build(store, lo, plotPx, { coarse: catchingUp });
  const view = foldLanes(built, lanes, { fold: el.foldLanes.checked, window: laneWindow?.lanes ?? null });
  el.foldLanes.parentElement.hidden = !view.bands && el.foldLanes.checked && !laneWindow;
  lanesShown = view;
  const key = laneWindow ? `lanes-${laneWindow.id}` : view.bands ? "folded" : "slots";
  return { ...view, barriers: storeBarriers(store), lo, hi, key };
}
// the lanes on screen, and the rollout lanes a zoom chose ({id, lanes, folded: whether it
// unfolded bands}); the pinned lanes are shown above them either way (static/js/lanefold.js)
let lanesShown = null, laneWindow = null, laneWindows = 0;

// ---- Keeping up under load ------------------------------------------------------------------
// The tiles (progress, idle, step time, reward) read the metrics at once; the Gantt redraws within
// the draw budget, which on a loaded machine can be seconds apart. So that the two never tell
// different stories, the tiles show the steps up to the Gantt's newest drawn step (at most one
// step ahead of it: "8 / 20 steps done, training step 8" beside a Gantt drawn to step 7 or 8),
// and while the Gantt is behind (spans of a newer step undrawn, or frames waiting over
// BEHIND_MS) the page shows "catching up", draws the Gantt coarse (bars merged at pixel
// resolution inside the window too) and holds the metric charts, which share its budget, until
// it has caught up, giving the Gantt their share of the budget (CATCHUP_SHARE of a core in all
// instead of DRAW_SHARE): cheaper, complete redraws instead of detailed ones that fall behind.
const BEHIND_MS = 1000;
const CATCHUP_SHARE = 0.3;
let drawnStep = null; // the newest step of the last Gantt draw (null: none yet)
let catchingUp = false;
const undrawn = { frames: 0, sinceMs: null }; // span frames received since the last redraw began
const newestStep = () => { const steps = store.sortedSteps(); return steps.length ? steps[steps.length - 1] : null; };

/** The steps the tiles may show: every metric step, or while the Gantt is behind (live, with spans
 * drawn), those up to its newest drawn step. */
function shownMetricSteps() {
  const steps = [...metrics.keys()];
  if (!replayDone || drawnStep === null || !store.size) return steps;
  const newest = newestStep();
  if (newest === null || newest <= drawnStep) return steps;
  return steps.filter((s) => s <= drawnStep);
}

/** Frames and seconds the Gantt is behind what the page holds; the "catching up" marker. */
function behindState() {
  const newest = newestStep();
  return {
    frames: undrawn.frames, seconds: undrawn.sinceMs === null ? 0 : (epochMs() - undrawn.sinceMs) / 1000,
    steps: newest === null || drawnStep === null ? 0 : Math.max(0, newest - drawnStep),
  };
}

function checkBehind() {
  const b = behindState(), marker = $("gantt-behind");
  const behind = replayDone && drawnStep !== null && (b.steps >= 2 || b.seconds * 1000 >= BEHIND_MS);
  if (behind !== catchingUp) {
    catchingUp = behind;
    // the charts' draws wait, so the Gantt may spend their share of the budget
    drawBudget.setShare(behind ? CATCHUP_SHARE : DRAW_SHARE);
    if (behind) requestGantt({ now: true }); // one coarse redraw at once, booked on the budget
    else requestChartsIfHeld();
  }
  marker.hidden = !behind;
  if (behind) {
    marker.textContent = `catching up: drawn to step ${drawnStep}, step ${drawnStep + b.steps} received` +
      ` (${b.frames} frame${b.frames === 1 ? "" : "s"}, ${b.seconds.toFixed(1)} s behind); detail reduced`;
  }
  root.dataset.behind = behind ? "1" : "0";
}
setInterval(checkBehind, 250);

async function drawGantt() {
  if (!store.size) return;
  const drawnVersion = store.version, drawnSize = store.size, started = epochMs();
  const newest = newestStep(), framesIn = undrawn.frames;
  undrawn.frames = 0; undrawn.sinceMs = null; // frames from here on wait for the next redraw
  const { bars: allBars, lanes, barriers, lo, hi, key } = ganttView();
  const follow = el.follow.checked;
  const builtMs = epochMs();
  await gantt.draw({
    bars: allBars, lanes, barriers,
    xRange: follow ? [lo, hi + (hi - lo) * 0.02] : laneWindow?.xRange ?? null, uirevision: `gantt-${followEpoch}-${key}`,
  });
  draws++;
  spansDrawn = allBars.reduce((n, b) => n + b.n, 0);
  barsDrawn = allBars.length;
  el.spansDrawn.textContent = `spans drawn: ${spansDrawn}`;
  const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;
  // what is shown: a folded chart's bands hold many rollout lanes each
  const bands = lanesShown?.bands;
  el.barsHint.textContent = bands
    ? `${plural(barsDrawn, "bar")}: ${plural(bands.reduce((n, b) => n + b.members.length, 0), "rollout lane")} folded into ${plural(bands.length, "band")}` +
      `, ${plural(lanes.length - bands.length, "lane")} unfolded`
    : `${plural(barsDrawn, "bar")} on ${plural(lanes.length, "lane")}`;
  const drawnMs = epochMs();
  if (DEBUG) {
    drawLog.push({ startMs: started, builtMs, endMs: drawnMs, bars: barsDrawn });
    for (const f of frameLog) if (f.drawnMs === null && f.recvMs <= started) f.drawnMs = drawnMs;
  }
  el.gantt.dataset.drawnSpans = String(spansDrawn);
  // the newest step this draw holds (not one that arrived while plotly drew): the trace range's
  // bound, and what the tiles keep within one step of
  drawnStep = newest;
  root.dataset.lastStep = newest === null ? "" : String(newest);
  el.gantt.dataset.coarse = catchingUp ? "1" : "0";
  if (DEBUG) drawLog[drawLog.length - 1].frames = framesIn;
  drawStats();
  drawProgress();
  checkBehind();
  if (store.version !== drawnVersion || store.size !== drawnSize) requestGantt();
  else if (!catchingUp) requestChartsIfHeld();
}
// During a replay the frames arrive back to back: draw only to show progress on a replay that
// takes long, then at once on replay_done, then live at most four times a second, and within
// DRAW_SHARE of one core. A redraw of ~20k bars costs ~50-150 ms of this thread on a 2-core
// machine (mostly plotly's axes), during which websocket frames wait; the share bounds what a
// page left open takes from a run on the same cores (docs/bench-web.md, "A viewer beside a run").
const REPLAY_PROGRESS_MS = 3000;
const DRAW_SHARE = 0.15;
// one budget for every redraw of the page (the Gantt's and the charts'): 15% of a core in all
const drawBudget = new DrawBudget(DRAW_SHARE);
const requestGantt = throttledRedraw(drawGantt, () => (replayDone ? 250 : REPLAY_PROGRESS_MS), { budget: drawBudget });
// the metric charts draw only while on screen (static/js/onscreen.js)
const onScreen = new OnScreen();

el.windowSteps.addEventListener("change", () => { el.follow.checked = true; followEpoch++; requestGantt(); });
el.follow.addEventListener("change", () => { if (el.follow.checked) followEpoch++; requestGantt(); });
for (const input of [el.laneMode, $("traj-step")]) {
  input.addEventListener("change", () => {
    $("traj-step-label").hidden = el.laneMode.value !== "traj";
    el.follow.checked = true;
    followEpoch++;
    requestGantt({ now: true });
  });
}

$("process-quantity").addEventListener("change", () => drawCharts());
el.foldLanes.addEventListener("change", () => { laneWindow = null; followEpoch++; requestGantt({ now: true }); });

function watchUserZoom() {
  // A user zoom or pan stops following the live edge until "follow live" is ticked again.
  gantt.on("plotly_relayout", (ev) => {
    if (Object.keys(ev).some((k) => k.startsWith("xaxis.range") || k === "xaxis.autorange")) el.follow.checked = false;
    // a zoom into the lane axis shows the rollout lanes it covers (a folded band's lanes
    // unfolded) in full rows below the pinned learner and replica lanes; autorange zooms out
    const [y0, y1] = ev["yaxis.range"] ?? [ev["yaxis.range[0]"], ev["yaxis.range[1]"]]; // a call, or a box zoom
    if (lanesShown && y0 !== undefined && y1 !== undefined) {
      const chosen = zoomedLanes(lanesShown.lanes, lanesShown.bands, [y0, y1]);
      if (chosen) {
        const [x0, x1] = ev["xaxis.range"] ?? [ev["xaxis.range[0]"], ev["xaxis.range[1]"]];
        laneWindow = { id: ++laneWindows, lanes: chosen, folded: laneWindow?.folded ?? el.foldLanes.checked,
          xRange: x0 !== undefined && x1 !== undefined ? [x0, x1] : null };
        el.foldLanes.checked = false;
        requestGantt({ now: true });
      }
    } else if (ev["yaxis.autorange"] && laneWindow) {
      el.foldLanes.checked = laneWindow.folded;
      laneWindow = null;
      requestGantt({ now: true });
    }
  });
}

// ---- Metrics -----------------------------------------------------------------------------
function latest(key) {
  const steps = shownMetricSteps().sort((a, b) => b - a);
  for (const s of steps) if (metrics.get(s)[key] !== undefined) return metrics.get(s)[key];
  return undefined;
}

/** The newest step's window: [step/t_start, step/t_end] once its metrics exist (the window of
 * trainer/idle_ratio, so the two tiles agree), else from its first span to the newest one. */
function newestStepWindow() {
  const steps = store.sortedSteps();
  if (!steps.length) return null;
  const step = steps[steps.length - 1], values = metrics.get(step);
  const start = values?.[METRIC.T_START], end = values?.[METRIC.T_END];
  return typeof start === "number" && typeof end === "number"
    ? { step, lo: start, hi: end, done: true } : { step, lo: store.steps.get(step).tStart, hi: store.tMax, done: false };
}

function drawStats() {
  const stepWindow = newestStepWindow();
  const running = stepWindow && store.runningIdle(stepWindow);
  const sofar = stepWindow?.done ? "step done" : "so far";
  if (running && !stepWindow.done && TERMINAL.has(status)) {
    // the run ended inside this step: its idle "so far" grows no more and would read as live
    el.idleLive.textContent = "—";
    el.idleLiveHint.textContent = `step ${running.step} did not finish: run ${status}`;
  } else {
    el.idleLive.textContent = running ? pct(running.ratio) : "—";
    el.idleLiveHint.textContent = running ? `step ${running.step}, ${running.seconds.toFixed(1)} s ${sofar}` : "from spans of the current step";
  }
  el.idleLast.textContent = pct(latest(METRIC.TRAINER_IDLE));
  const stepTime = latest(METRIC.STEP_S);
  el.stepTime.textContent = stepTime === undefined ? "—" : `${num(stepTime)} s`;
  el.reward.textContent = num(latest(METRIC.REWARD_MEAN), 3);
  const sMean = latest(METRIC.STALENESS_MEAN), sMax = latest(METRIC.STALENESS_MAX);
  el.staleness.textContent = sMean === undefined ? "—" : `${num(sMean)} / ${num(sMax, 0)}`;
}

async function drawMetrics() {
  const list = [...metrics.entries()].map(([step, values]) => ({ step, values }));
  const s = (key, name, scale = 1, extra = {}) => ({ name, ...metricSeries(list, key, scale), ...extra });
  const draw = (chart, figure) => onScreen.draw(chart, () => drawFigure(chart, figure));
  await Promise.all([
    draw(el.chartIdle, seriesFigure([
      s(METRIC.TRAINER_IDLE, "learner idle", 100, { colour: "#e15759" }),
      s(METRIC.TRAINER_WAIT, "learner waiting for data", 100, { colour: "#f28e2b" }),
      s(METRIC.ROLLOUT_IDLE, "rollout idle", 100, { colour: "#4c78a8" }),
    ], { kind: "bar", yTitle: "idle %", yRange: [0, 100] })),
    draw(el.chartStepTime, seriesFigure([s(METRIC.STEP_S, "step time", 1, { colour: "#222a38" })], { kind: "bar", yTitle: "seconds" })),
    draw(el.chartReward, seriesFigure([s(METRIC.REWARD_MEAN, METRIC.REWARD_MEAN, 1, { colour: "#59a14f" })], { yTitle: "mean reward" })),
    draw(el.chartStaleness, seriesFigure([
      s(METRIC.STALENESS_MEAN, "mean", 1, { colour: "#b07aa1" }),
      s(METRIC.STALENESS_MAX, "max", 1, { colour: "#b07aa1", dash: "dot" }),
    ], { yTitle: "policy versions" })),
    draw($("chart-processes"), processFigure(list, $("process-quantity").value, [...systemSamples.values()])),
  ]);
}
const metricPanel = new MetricPanel($("metric-panel"), { onScreen });
const panelRuns = () => [{ name: root.dataset.runName, colour: "#2457c5",
  metrics: [...metrics.entries()].map(([step, values]) => ({ step, values })) }];
const drawCharts = throttledRedraw(async () => {
  await drawMetrics();
  chartsDrawnMs = epochMs();
  await metricPanel.update(panelRuns());
}, 400, { budget: drawBudget });
/** New metrics: the panel's list of names at once, the charts when the draw budget allows (held
 * while the Gantt catches up: it goes first). */
let chartsHeld = false;
function requestMetrics() {
  metricPanel.list(panelRuns());
  if (catchingUp) chartsHeld = true;
  else drawCharts();
}
function requestChartsIfHeld() {
  if (!chartsHeld) return;
  chartsHeld = false;
  drawCharts();
}

// ---- Progress and log --------------------------------------------------------------------
const clock = (ms) => { // m:ss or h:mm:ss
  const s = Math.max(0, Math.round(ms / 1000)), h = Math.floor(s / 3600), m = Math.floor(s / 60) % 60;
  const two = (v) => String(v).padStart(2, "0");
  return h ? `${h}:${two(m)}:${two(s % 60)}` : `${m}:${two(s % 60)}`;
};

/** The newest "boot: ..." line of the log: what the learner is doing before its first step. */
function bootPhase() {
  const numbers = [...logLines.keys()].sort((a, b) => b - a);
  for (const n of numbers) if (logLines.get(n).startsWith("boot: ")) return logLines.get(n).slice(6);
  return null;
}

// Steps with stored metrics when the page was rendered: until the replay has brought them, the
// progress line counts these (a reloaded page of a run at step 7 must not say "first generate").
const renderedDone = Number(root.dataset.stepsDone || 0);

/** Steps done (metrics received), elapsed and ETA (mean of the last 3 step times x steps left). */
function progressText() {
  const shown = shownMetricSteps();
  const done = replayDone ? shown.length : Math.max(metrics.size, renderedDone), total = totalSteps;
  const elapsed = startedMs === null ? null : (finishedMs ?? epochMs()) - startedMs;
  const took = elapsed === null ? "" : ` in ${clock(elapsed)}`;
  // Steps are numbered from 0 everywhere (tiles, charts, the Gantt): "3 / 20 steps done" are
  // steps 0-2, and step 3 is the one training.
  const range = done ? ` (steps 0–${done - 1})` : "";
  if (status === "queued") return "queued: waiting for a worker";
  if (status === "succeeded") return `finished: ${done} / ${total} steps${range}${took}`;
  if (status === "failed") return `failed after ${done} / ${total} steps${range}${took}`;
  if (status === "cancelled") return `cancelled after ${done} / ${total} steps${range}${took}`;
  const since = elapsed === null ? "" : ` · ${clock(elapsed)} elapsed`;
  if (!done) {
    const phase = status === "running" && !store.size && replayDone ? "first generate" : bootPhase();
    return `${status === "running" ? "running" : "starting"}${phase ? `: ${phase}` : "…"}${since}`;
  }
  // every step trained, the run not ended yet: the learner saves the final policy and stops its
  // workers (there is no step N to train)
  if (done >= total) return `all ${total} steps done${range}, finishing: saving the final policy${since}`;
  const recent = shown.sort((a, b) => b - a).slice(0, 3).map((k) => metrics.get(k)[METRIC.STEP_S]);
  const perStep = recent.length ? recent.reduce((a, b) => a + (b ?? 0), 0) / recent.length : 0;
  const eta = done < total && perStep > 0 ? ` · ETA ${clock((total - done) * perStep * 1000)}` : "";
  return `${done} / ${total} steps done, training step ${done}${since}${eta}`;
}
const drawProgress = () => { el.progress.textContent = progressText(); };
setInterval(() => { if (!TERMINAL.has(status)) drawProgress(); }, 1000);

function addLog(first, lines) {
  lines.forEach((line, i) => logLines.set(first + i, line));
  const numbers = [...logLines.keys()].sort((a, b) => a - b);
  for (const n of numbers.slice(0, Math.max(0, numbers.length - LOG_KEEP))) logLines.delete(n);
  const atBottom = el.log.scrollTop + el.log.clientHeight >= el.log.scrollHeight - 4;
  el.log.textContent = readableLog(numbers.slice(-LOG_KEEP).map((n) => logLines.get(n))).join("\n") || "—";
  if (atBottom) el.log.scrollTop = el.log.scrollHeight;
  drawProgress();
}

// ---- Status ------------------------------------------------------------------------------
function setStatus(next, error, frame = {}) {
  status = next;
  if (el.resume) el.resume.hidden = !frame.resumable;
  if (frame.started !== undefined) startedMs = parseTime(frame.started);
  if (frame.finished !== undefined) finishedMs = parseTime(frame.finished);
  if (!store.size) gantt.note(TERMINAL.has(next) ? "This run recorded no spans." : "Waiting for the first spans…");
  el.badge.textContent = next;
  el.badge.className = `badge status-${next}`;
  root.dataset.status = next;
  el.cancel.hidden = TERMINAL.has(next);
  $("delete-link").hidden = !TERMINAL.has(next); // a run is deleted once it has ended
  if (TERMINAL.has(next)) {
    el.conn.textContent = `run ${next}`;
    el.conn.className = "conn done";
    document.querySelectorAll(".message.until-finished").forEach((m) => m.remove()); // "Cancelling …"
  }
  if (error) { el.error.textContent = error; el.error.hidden = false; }
  drawStats();
  drawProgress();
}

// ---- Websocket ---------------------------------------------------------------------------
function handleFrame(frame) {
  switch (frame.type) {
    case "spans": {
      const spans = frame.spans || [];
      if (DEBUG && spans.length) {
        frameLog.push({ n: spans.length, firstSeq: spans[0].seq, lastSeq: spans[spans.length - 1].seq, recvMs: epochMs(), drawnMs: null });
      }
      const added = store.add(spans);
      if (added && replayDone) {
        undrawn.frames++;
        undrawn.sinceMs ??= epochMs();
        checkBehind();
      }
      if (added && (replayDone || epochMs() - connectedMs > REPLAY_PROGRESS_MS)) requestGantt();
      if (!replayDone) el.spansDrawn.textContent = `receiving: ${store.size}`;
      break;
    }
    case "metrics":
      for (const m of frame.metrics || []) metrics.set(m.step, m.values);
      if (replayDone) requestMetrics(); // during a replay the Gantt goes first, at replay_done
      drawProgress();
      drawStats();
      break;
    case "system": // the processes every tracking.system_every_s seconds; a replay sends them again
      for (const sample of frame.samples || []) systemSamples.set(`${sample.node}@${sample.t}`, sample);
      if (replayDone) requestMetrics();
      break;
    case "status":
      setStatus(frame.status, frame.error, frame);
      break;
    case "log":
      addLog(frame.first, frame.lines || []);
      break;
    case "trajectories":
      trajRecords.stored(frame.steps || []);
      if (el.laneMode.value === "traj") requestGantt();
      if (selection.traj !== null && !shownText.record) showTrajectoryText(selection.traj, selection.note.dataset.state);
      break;
    case "assignment": // fully-async: rollouts a step took, held here with step -1 until now
      if (store.assign(frame.step, frame.trajs || []) && replayDone) requestGantt();
      break;
    case "replay_done":
      replayDone = true;
      requestGantt({ now: true });
      requestMetrics(); // draws "no data yet" for a run without metrics
      break;
    default:
      console.warn("unknown frame type", frame.type);
  }
}

function connect() {
  const proto = location.protocol === "https:" ? "wss" : "ws";
  // Resume after the highest seq below which nothing is missing; the store drops any resent span.
  const after = store.watermark >= 0 ? `?after=${store.watermark}` : "";
  const socket = new WebSocket(`${proto}://${location.host}${root.dataset.wsPath}${after}`);
  ws = socket;
  connects++;
  replayDone = false;
  socket.onopen = () => {
    if (!TERMINAL.has(status)) { el.conn.textContent = "live"; el.conn.className = "conn live"; }
    retryMs = 500;
    connectedMs = epochMs();
  };
  let received = 0;
  socket.onmessage = (ev) => { handleFrame(JSON.parse(ev.data)); received++; ackSoon(socket, () => received); };
  socket.onclose = (ev) => {
    closeCodes.push(ev.code);
    if (ws !== socket) return; // replaced by reconnect()
    if (FINAL_CLOSES[ev.code]) {
      el.conn.textContent = "closed";
      el.conn.className = "conn down";
      el.error.textContent = FINAL_CLOSES[ev.code];
      el.error.hidden = false;
      return;
    }
    // A finished run has nothing more to send once its replay is complete.
    if (TERMINAL.has(status) && replayDone) return;
    el.conn.textContent = "disconnected, retrying…";
    el.conn.className = "conn down";
    // A random share of the back-off: a Redis restart closes every page of a server at once (4503),
    // and their replays arriving together would keep it past its handshake timeout.
    setTimeout(connect, retryMs * (0.5 + Math.random()));
    retryMs = Math.min(retryMs * 2, MAX_RETRY_MS);
  };
}

// The server paces its replay by these acks and closes (4408) a socket that falls too far behind,
// after which the page resumes with ?after as after any drop (docs/controller-api.md, "Websocket").
const ACK_EVERY_MS = 100;
let ackTimer = null, lastAckMs = 0;
function ackSoon(socket, count) {
  const send = () => {
    ackTimer = null;
    lastAckMs = epochMs();
    if (socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify({ type: "ack", frames: count() }));
  };
  if (!replayDone || epochMs() - lastAckMs >= ACK_EVERY_MS) send();
  else if (ackTimer === null) ackTimer = setTimeout(send, ACK_EVERY_MS);
}

/** Drops the socket as a network failure would and reconnects at once (browser tests). */
function reconnect() {
  const old = ws;
  ws = null;
  if (old) old.close();
  connect();
}

if (DEBUG) window.__thundersync = {
  reconnect,
  state: () => ({
    spansReceived: store.size, spansDrawn, barsDrawn, draws, lastSeq: store.maxSeq, drawMs: drawBudget.spentMs,
    watermark: store.watermark, duplicates: store.duplicates, connects, status, replayDone, chartsDrawnMs,
    logLines: logLines.size, stepsDone: metrics.size, closeCodes, drawnStep, catchingUp, behind: behindState(),
    open: !!ws && ws.readyState === WebSocket.OPEN,
  }),
  seqs: () => [...store.bySeq.keys()].sort((a, b) => a - b),
  // the step numbers the charts (metrics) and the Gantt (spans) hold: continuous across a resume
  metricSteps: () => [...metrics.keys()].sort((a, b) => a - b),
  spanSteps: () => [...new Set([...store.bySeq.values()].map((s) => s.step))].sort((a, b) => a - b),
  frames: () => frameLog,
  draws: () => drawLog,
  barsByKind: () => gantt.barsByKind(),
  // the bars the chart's current axes show (what the canvas and a download paint), per kind
  shownByKind: () => {
    const shown = {};
    for (const { kind, rects } of gantt.barRects().kinds) shown[kind] = (shown[kind] ?? 0) + rects.length;
    return shown;
  },
  dimmed: () => Boolean(gantt.overlay?.dim), // a followed trajectory fades the rest of the chart
  // the charts whose latest draw waits for them to scroll into view (static/js/onscreen.js)
  waitingCharts: () => [...onScreen.waiting.keys()].map((c) => c.id || c.dataset.metric),
};

// One click must not end a long run: the cancel form asks first.
el.cancel.addEventListener("submit", (ev) => {
  const done = metrics.size;
  if (!window.confirm(`Cancel ${root.dataset.runName}? It has done ${done} of ${totalSteps} steps; a cancelled run cannot be continued without a checkpoint.`)) ev.preventDefault();
});

// The socket first: the server's replay overlaps the evaluation of plotly.js (deferred script).
connect();
setStatus(status, "", { resumable: Boolean(el.resume && !el.resume.hidden) });
watchUserZoom();
