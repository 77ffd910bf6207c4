// "By trajectory" lanes for one step: one row per trajectory (its rollout turns, tool waits,
// verify, then its learner.backward, on the same row), the learner's other spans of the step
// (group close, optimizer, publish) on their own lanes above. A trajectory rolled out for the
// step that no backward trained keeps its row, named for why (skipped once the step is done:
// its group's rewards were equal, advantage 0; else not trained yet).
import { KIND } from "./conventions.js";
import { isLearnerKind, orderLanes } from "./spans.js";

const trajLane = (traj, note) => (note ? `traj ${traj} · ${note}` : `traj ${traj}`);

/**
 * The trajectories of ``step``: trained in it (their backward's step), and those rolled out for
 * it that no backward trained (anywhere), as a map traj -> "" or why it has no backward.
 */
function trajectoriesOf(spans, step, stepDone) {
  const trained = new Set(), rolled = new Set(), anyBackward = new Set();
  for (const s of spans) {
    if (s.traj === null || s.traj === undefined) continue;
    if (s.kind === KIND.BACKWARD) anyBackward.add(s.traj);
    if (s.step !== step) continue;
    (s.kind === KIND.BACKWARD ? trained : rolled).add(s.traj);
  }
  const trajs = new Map([...trained].map((t) => [t, ""]));
  for (const t of rolled) if (!anyBackward.has(t)) trajs.set(t, stepDone ? "skipped" : "not trained yet");
  return trajs;
}

/** {bars, lanes, range} of ``step`` from a SpanStore, in the GanttChart's bar shape; ``stepDone``:
 * the step's metrics exist (its learner work is over). */
export function trajectoryView(store, step, stepDone = false) {
  const spans = [...store.spans()];
  const trajs = trajectoriesOf(spans, step, stepDone);
  const bars = [], learnerLanes = new Set();
  let lo = Infinity, hi = -Infinity;
  for (const s of spans) {
    let lane = null;
    if (s.traj !== null && s.traj !== undefined && trajs.has(s.traj)) lane = trajLane(s.traj, trajs.get(s.traj));
    else if (s.step === step && isLearnerKind(s.kind) && s.lane.startsWith("learner")) lane = s.lane;
    if (lane === null) continue;
    if (!lane.startsWith("traj")) learnerLanes.add(lane);
    bars.push({ lane, kind: s.kind, t0: s.t0, t1: s.t1, n: 1, span: s });
    lo = Math.min(lo, s.t0);
    hi = Math.max(hi, s.t1);
  }
  const lanes = [...orderLanes(learnerLanes), ...[...trajs.keys()].sort((a, b) => a - b).map((t) => trajLane(t, trajs.get(t)))];
  return { bars, lanes, trajs: [...trajs.keys()], spans, range: bars.length ? [lo, Math.max(hi, lo + 1e-3)] : [0, 1] };
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
