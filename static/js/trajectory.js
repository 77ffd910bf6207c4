// One trajectory across the lanes of a Gantt: click a bar (or type a traj id) and every span of
// that trajectory (rollout turns, tool waits, verify, its learner.backward) and its group's close
// are painted over the faded chart, joined in time order by a connecting line; #traj-detail lists
// exactly the highlighted spans.
import { KIND } from "./conventions.js";
import { isLearnerKind } from "./spans.js";

const OUTLINE = "#111827";

/** The highlighted bars for ``traj`` among ``bars``: its spans and its group's close, by start. */
export function trajectoryBars(bars, traj) {
  const mine = bars.filter((b) => b.span && b.span.traj === traj);
  const groups = new Set(mine.map((b) => b.span.group).filter((g) => g !== null && g !== undefined));
  const closes = bars.filter((b) => b.span && b.span.kind === KIND.GROUP_CLOSE && groups.has(b.span.group));
  return [...mine, ...closes].sort((a, b) => a.t0 - b.t0 || a.t1 - b.t1);
}

function paintSelection(ctx, { x, laneY, thickness, colour }, bars) {
  // the path: end of each span to the start of the next one (reward -> backward across lanes)
  ctx.strokeStyle = OUTLINE;
  ctx.lineWidth = 1.2;
  ctx.setLineDash([4, 3]);
  ctx.beginPath();
  for (let i = 1; i < bars.length; i++) {
    const a = bars[i - 1], b = bars[i];
    if (a.lane === b.lane) continue;
    ctx.moveTo(x(a.t1), laneY.get(a.lane));
    ctx.lineTo(x(b.t0), laneY.get(b.lane));
  }
  ctx.stroke();
  ctx.setLineDash([]);
  for (const b of bars) {
    const x0 = x(b.t0), y = laneY.get(b.lane) - thickness / 2, w = Math.max(2, x(b.t1) - x0);
    ctx.fillStyle = colour(b.kind);
    ctx.fillRect(x0, y, w, thickness);
    ctx.strokeRect(x0, y, w, thickness);
  }
}

function row(span) {
  const tr = document.createElement("tr");
  Object.assign(tr.dataset, { kind: span.kind, traj: String(span.traj ?? ""), group: String(span.group ?? ""), seq: String(span.seq) });
  const cells = [span.kind, span.lane, span.step, span.turn ?? "–", span.policy_version ?? "–", span.tokens,
    span.t0.toFixed(3), span.t1.toFixed(3), ((span.t1 - span.t0) * 1000).toFixed(1)];
  for (const c of cells) {
    const td = document.createElement("td");
    td.textContent = String(c);
    tr.append(td);
  }
  return tr;
}

export class TrajectorySelection {
  /** chart: a GanttChart; search: a number input; detail: a <table>; note: where the summary line
   * goes; learnt(step) -> {done, skipped}: whether the learner is past the step, and how many
   * trajectories it skipped there (for a trajectory without a backward). */
  constructor(chart, { search, detail, note, learnt = () => ({ done: false, ended: false, skipped: null }) }) {
    // onRender(traj, state): after every render (the page shows the trajectory's text beside it)
    Object.assign(this, { chart, search, detail, note, learnt, traj: null, seenBars: null, bars: [], onRender: () => {} });
    chart.div.addEventListener("click", (ev) => {
      const span = chart.barAtEvent(ev)?.span;
      if (span && span.traj !== null && span.traj !== undefined) this.select(span.traj);
      else if (!span) this.select(null);
    });
    search.addEventListener("change", () => this.select(search.value.trim() === "" ? null : Number(search.value)));
  }

  select(traj) {
    this.traj = Number.isInteger(traj) ? traj : null;
    this.search.value = this.traj === null ? "" : String(this.traj);
    this.seenBars = null;
    const selection = this;
    // the chart is faded only while the trajectory has bars to show over it
    this.chart.overlay = this.traj === null ? null : {
      get dim() { selection.refresh(); return selection.bars.length > 0; },
      paint: (ctx, geometry) => { this.refresh(); paintSelection(ctx, geometry, this.bars); },
    };
    if (this.traj === null) this.render();
    this.chart.paint();
  }

  refresh() {
    if (this.seenBars !== this.chart.bars) { // a redraw brought new bars: find the trajectory's again
      this.seenBars = this.chart.bars;
      this.bars = trajectoryBars(this.chart.bars, this.traj);
      this.render();
    }
  }

  render() {
    const spans = this.traj === null ? [] : this.bars.map((b) => b.span);
    const body = document.createElement("tbody");
    body.append(...spans.map(row));
    this.detail.tBodies[0]?.remove();
    this.detail.append(body);
    this.detail.hidden = !spans.length;
    this.detail.dataset.traj = this.traj === null ? "" : String(this.traj);
    this.note.textContent = this.traj === null ? "Click a bar, or type a trajectory id, to follow one trajectory."
      : spans.length ? summary(this.traj, spans, this.learnt)
        : `trajectory ${this.traj} is not in the drawn steps: choose "all steps", or the by-trajectory lanes of its step`;
    this.note.dataset.state = this.traj === null ? "" : spans.length ? trainedState(this.traj, spans, this.learnt) : "absent";
    this.note.dataset.drafted = spans.some((s) => s.kind === KIND.DRAFT) ? "1" : "0";
    this.onRender(this.traj, this.note.dataset.state);
  }
}

/** "trained", "skipped" (the learner is past its step and spent no backward on it) or "pending". */
function trainedState(traj, spans, learnt) {
  if (spans.some((s) => s.kind === KIND.BACKWARD)) return "trained";
  const first = spans.find((s) => s.traj === traj);
  return learnt(first.step).done ? "skipped" : "pending";
}

/** Why a trajectory has no backward, in words. */
function untrained(traj, spans, learnt) {
  const step = spans.find((s) => s.traj === traj).step;
  const { done, ended, skipped } = learnt(step);
  if (!done) return ended ? `never trained: the run ended before step ${step} finished` : "not trained yet";
  const count = skipped === null ? "" : ` (${skipped} trajectories skipped in step ${step}, learner/skipped_trajectories)`;
  return `skipped: no backward, its group's rewards were all equal so its advantage is 0${count}`;
}

/** "traj 12 · group 3 · 4 rollout spans · backward 35 ms after its last rollout span" */
function summary(traj, spans, learnt) {
  const rollout = spans.filter((s) => s.traj === traj && !isLearnerKind(s.kind));
  const backward = spans.find((s) => s.kind === KIND.BACKWARD);
  const parts = [`trajectory ${traj}`, `group ${spans[0].group ?? "–"}`, `${rollout.length} rollout spans`];
  const drafts = rollout.filter((s) => s.kind === KIND.DRAFT).length;
  if (drafts) parts.push(`drafted: ${drafts} draft turn${drafts === 1 ? "" : "s"} (rollout.draft) under older weights, verified by rollout.draft_verify`);
  if (backward && rollout.length) {
    const gap = backward.t0 - Math.max(...rollout.map((s) => s.t1));
    parts.push(`backward on ${backward.lane} ${(gap * 1000).toFixed(0)} ms after its last rollout span`);
  } else if (!backward) parts.push(untrained(traj, spans, learnt));
  return parts.join(" · ");
}
