// Span bookkeeping shared by the live run page and the compare page.
// A span is the backend's JSON: {seq, step, kind, t0, t1, lane, traj, group, turn, policy_version, tokens}
// with times in seconds since run start (docs/spans.md).

import { KIND, LEARNER_KINDS } from "./conventions.js";

// Presentation only: one colour per kind and the legend order. Kinds the backend sends that are
// not listed here still get drawn, with a fallback colour.
const KIND_COLOURS = new Map([
  [KIND.GENERATE, "#4c78a8"],
  [KIND.TOOL, "#f2a03d"],
  [KIND.TOOL_WAIT, "#f7c98b"],
  [KIND.VERIFY, "#59a14f"],
  [KIND.TEACHER, "#b07aa1"],
  // speculation (docs/speculation.md): a draft turn generated under older weights, then its verify forward
  [KIND.DRAFT, "#a0cbe8"],
  [KIND.DRAFT_VERIFY, "#7b4fa0"],
  [KIND.BACKWARD, "#e15759"],
  [KIND.GROUP_CLOSE, "#76b7b2"],
  [KIND.OPTIMIZER, "#222a38"],
  [KIND.PUBLISH, "#edc948"],
]);
const FALLBACK_COLOURS = ["#9c755f", "#bab0ac", "#ff9da7", "#8cd17d"];

const UNASSIGNED = -1; // the step of a fully-async rollout span no step has taken yet

export function kindColour(kind, index = 0) {
  return KIND_COLOURS.get(kind) ?? FALLBACK_COLOURS[index % FALLBACK_COLOURS.length];
}

export function isLearnerKind(kind) {
  return LEARNER_KINDS.has(kind);
}

/** Legend order: the known kinds in pipeline order, then any others alphabetically. */
export function orderKinds(kinds) {
  const known = [...KIND_COLOURS.keys()];
  const rank = (k) => (known.includes(k) ? known.indexOf(k) : known.length);
  return [...kinds].sort((a, b) => rank(a) - rank(b) || a.localeCompare(b));
}

/** Lane order: learner ranks first, then replicas (and other lanes), then rollout slots by worker then slot, numerically. */
export function orderLanes(lanes) {
  const key = (lane) => {
    const parts = lane.split("/");
    // learner ranks, then replicas and any other lane, rollout slots last: the few lanes that
    // matter most stay on top at any rollout lane count (learner/chrome_trace.py lane_sort_key)
    const group = parts[0] === "learner" ? 0 : parts[0] === "rollout" ? 2 : 1;
    return [group, ...(group === 1 ? [parts[0]] : []), ...parts.slice(1).map((p) => (/^\d+$/.test(p) ? Number(p) : p))];
  };
  return [...lanes].sort((a, b) => {
    const ka = key(a), kb = key(b);
    for (let i = 0; i < Math.max(ka.length, kb.length); i++) {
      if (ka[i] === undefined) return -1;
      if (kb[i] === undefined) return 1;
      if (ka[i] !== kb[i]) return typeof ka[i] === "number" && typeof kb[i] === "number"
        ? ka[i] - kb[i] : String(ka[i]).localeCompare(String(kb[i]));
    }
    return 0;
  });
}

/** Length of the union of [t0, t1] intervals clipped to [lo, hi] (same as learner.timeline.union_length). */
export function unionLength(intervals, lo, hi) {
  const clipped = intervals
    .filter(([a, b]) => b > lo && a < hi)
    .map(([a, b]) => [Math.max(a, lo), Math.min(b, hi)])
    .sort((x, y) => x[0] - y[0]);
  let total = 0, curA = null, curB = null;
  for (const [a, b] of clipped) {
    if (curB === null || a > curB) {
      if (curB !== null) total += curB - curA;
      curA = a; curB = b;
    } else {
      curB = Math.max(curB, b);
    }
  }
  if (curB !== null) total += curB - curA;
  return total;
}

/**
 * Every span received, deduplicated by seq, with per-step and per-lane summaries kept
 * incrementally so a redraw never rescans history it does not need.
 */
export class SpanStore {
  constructor() {
    this.bySeq = new Map();
    this.lanes = new Set();
    this.kinds = new Set();
    this.steps = new Map(); // step -> {tStart, tEnd, optimizerStart}
    this.learnerSpans = []; // learner-kind spans, for the running idle ratio
    this.unassigned = new Map(); // traj -> its spans of step -1 (fully-async, before a step took it)
    this.maxSeq = -1;
    this.watermark = -1; // highest seq with every seq <= it present: safe resume point
    this.duplicates = 0;
    this.tMin = Infinity;
    this.tMax = 0;
    this.version = 0; // bumps on every change; renderers use it to skip no-op redraws
  }

  get size() { return this.bySeq.size; }

  /** Adds spans, ignoring seqs already held; returns how many were new. */
  add(spans) {
    let added = 0;
    for (const s of spans) {
      if (this.bySeq.has(s.seq)) { this.duplicates++; continue; }
      this.bySeq.set(s.seq, s);
      added++;
      this.lanes.add(s.lane);
      this.kinds.add(s.kind);
      this.maxSeq = Math.max(this.maxSeq, s.seq);
      this.tMin = Math.min(this.tMin, s.t0);
      this.tMax = Math.max(this.tMax, s.t1);
      const info = this.steps.get(s.step) ?? { tStart: Infinity, tEnd: -Infinity, optimizerStart: null };
      info.tStart = Math.min(info.tStart, s.t0);
      info.tEnd = Math.max(info.tEnd, s.t1);
      if (s.kind === KIND.OPTIMIZER) {
        info.optimizerStart = info.optimizerStart === null ? s.t0 : Math.min(info.optimizerStart, s.t0);
      }
      this.steps.set(s.step, info);
      if (isLearnerKind(s.kind)) this.learnerSpans.push(s);
      if (s.step === UNASSIGNED && s.traj !== null && s.traj !== undefined) {
        const held = this.unassigned.get(s.traj) ?? [];
        held.push(s);
        this.unassigned.set(s.traj, held);
      }
    }
    while (this.bySeq.has(this.watermark + 1)) this.watermark++;
    if (added) this.version++;
    return added;
  }

  /**
   * fully-async's assignment frame: ``trajs``' spans held with step -1 move to ``step`` (the
   * database already has them there, docs/spans.md "Assignment"); returns how many moved.
   */
  assign(step, trajs) {
    let moved = 0;
    for (const traj of trajs) {
      for (const s of this.unassigned.get(traj) ?? []) {
        s.step = step;
        const info = this.steps.get(step) ?? { tStart: Infinity, tEnd: -Infinity, optimizerStart: null };
        info.tStart = Math.min(info.tStart, s.t0);
        info.tEnd = Math.max(info.tEnd, s.t1);
        this.steps.set(step, info);
        moved++;
      }
      this.unassigned.delete(traj);
    }
    if (moved) this.version++;
    return moved;
  }

  spans() { return this.bySeq.values(); }

  sortedSteps() { return [...this.steps.keys()].filter((s) => s >= 0).sort((a, b) => a - b); }

  /**
   * Learner idle share of ``step`` over [lo, hi]: 1 - |union of learner spans| / (hi - lo), the
   * running counterpart of trainer/idle_ratio (learner.timeline.window_metrics); equal to it
   * once [lo, hi] is the step's [step/t_start, step/t_end].
   */
  runningIdle({ step, lo, hi }) {
    if (!(hi > lo)) return null;
    const busy = unionLength(this.learnerSpans.map((s) => [s.t0, s.t1]), lo, hi);
    return { step, ratio: 1 - busy / (hi - lo), seconds: hi - lo };
  }
}
