// "By trajectory" lanes for one step: one row per trajectory (its rollout turns, tool waits,
// verify, then its learner.backward, on the same row), the learner's other spans of the step
// (group close, optimizer, publish) on their own lanes above.
import { KIND } from "./conventions.js";
import { isLearnerKind, orderLanes } from "./spans.js";

const trajLane = (traj) => `traj ${traj}`;

/** The trajectories trained in ``step`` (their backward's step), else those rolled out for it. */
function trajectoriesOf(spans, step) {
  const trained = new Set(), rolled = new Set();
  for (const s of spans) {
    if (s.traj === null || s.traj === undefined || s.step !== step) continue;
    (s.kind === KIND.BACKWARD ? trained : rolled).add(s.traj);
  }
  return trained.size ? trained : rolled;
}

/** {bars, lanes, range} of ``step`` from a SpanStore, in the GanttChart's bar shape. */
export function trajectoryView(store, step) {
  const spans = [...store.spans()];
  const trajs = trajectoriesOf(spans, step);
  const bars = [], learnerLanes = new Set();
  let lo = Infinity, hi = -Infinity;
  for (const s of spans) {
    let lane = null;
    if (s.traj !== null && s.traj !== undefined && trajs.has(s.traj)) lane = trajLane(s.traj);
    else if (s.step === step && isLearnerKind(s.kind) && s.lane.startsWith("learner")) lane = s.lane;
    if (lane === null) continue;
    if (!lane.startsWith("traj")) learnerLanes.add(lane);
    bars.push({ lane, kind: s.kind, t0: s.t0, t1: s.t1, n: 1, span: s });
    lo = Math.min(lo, s.t0);
    hi = Math.max(hi, s.t1);
  }
  const lanes = [...orderLanes(learnerLanes), ...[...trajs].sort((a, b) => a - b).map(trajLane)];
  return { bars, lanes, range: bars.length ? [lo, Math.max(hi, lo + 1e-3)] : [0, 1] };
}

/** The step select of the by-trajectory mode: follows the newest step until the user picks one. */
export class StepPicker {
  constructor(select) {
    this.select = select;
    this.chosen = null;
    select.addEventListener("change", () => { this.chosen = Number(select.value); });
  }

  /** Refreshes the options from ``steps`` (ascending) and returns the step to show. */
  pick(steps) {
    if (steps.length !== this.select.options.length) {
      this.select.replaceChildren(...steps.map((s) => new Option(`step ${s}`, String(s))));
    }
    const step = this.chosen !== null && steps.includes(this.chosen) ? this.chosen : steps[steps.length - 1] ?? 0;
    this.select.value = String(step);
    return step;
  }
}
