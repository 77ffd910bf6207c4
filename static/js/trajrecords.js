// Every trajectory readable: the learner's record of each trajectory after its step (its decoded
// prompt, turns, tool calls and observations, reward, advantage; docs/pages-run.md, "One trajectory"),
// read from GET <api>/trajectories/?step= (a step's, for the table) and <api>/trajectories/<traj>/
// (one, with its text) and drawn into #traj-text.
import { getJSON } from "./fetchjson.js";

export class TrajectoryRecords {
  /** onStep(step): a step's records arrived (redraw what shows them). */
  constructor(apiBase, onStep = () => {}) {
    Object.assign(this, { apiBase, onStep, steps: new Map(), asked: new Set() });
  }

  /** The step's records as Map traj -> summary, or null while they are fetched (or not stored yet). */
  step(step) {
    if (this.steps.has(step)) return this.steps.get(step);
    if (!this.asked.has(step)) {
      this.asked.add(step);
      getJSON(`${this.apiBase}trajectories/?step=${step}`).then((body) => {
        if (!body.trajectories.length) return; // not recorded yet: the server's trajectories frame says when
        this.steps.set(step, new Map(body.trajectories.map((t) => [t.traj, t])));
        this.onStep(step);
      }).catch(() => this.asked.delete(step));
    }
    return null;
  }

  /** The server stored these steps' records: forget what was fetched before. */
  stored(steps) {
    for (const s of steps) { this.steps.delete(s); this.asked.delete(s); }
  }

  async detail(traj) {
    return getJSON(`${this.apiBase}trajectories/${traj}/`);
  }
}

const fixed = (v, digits = 3) => (v === null || v === undefined ? "—" : Number(v).toFixed(digits));

/** What the learner did with it, in words: from its spans' state (``trained``, ``skipped``,
 * ``pending``) and its record (a zero advantage with no KL/entropy term has nothing to learn). */
export function learnerWords(record, state) {
  const drafted = record.drafted ? " · drafted (turns sampled under older weights, then verified)" : "";
  if (state === "trained") return `learnt (its backward ran)${drafted}`;
  if (record.zero_gradient) {
    const why = state === "skipped" ? "skipped" : "to be skipped";
    return `${why}: advantage 0 (every reward in group ${record.group} was equal) and no KL or entropy term, so its gradient is exactly 0 and no backward ran${drafted}`;
  }
  return (state === "skipped" ? "no backward recorded" : "not trained yet") + drafted;
}

function segmentLabel(seg) {
  if (seg.role === "prompt") return "prompt";
  if (seg.role === "observation") return `observation after turn ${seg.turn} (the tool's result)`;
  const parts = [`turn ${seg.turn}`];
  if (seg.version !== null && seg.version !== undefined) parts.push(`policy v${seg.version}`);
  if (seg.drafted_by !== undefined) parts.push(`drafted under v${seg.drafted_by}`);
  if (seg.tool_call) parts.push("tool call");
  return parts.join(" · ");
}

/** #traj-text: the record's facts, then each segment as labelled preformatted text. */
export function renderTrajectoryText(box, record, state) {
  const facts = document.createElement("div");
  facts.className = "traj-facts";
  const items = [["trajectory", record.traj], ["step", record.step], ["group", record.group],
    ["reward", fixed(record.reward)], ["advantage", fixed(record.advantage)], ["turns", record.turns],
    ["generated tokens", record.tokens], ["learner", learnerWords(record, state)]];
  if (record.error) items.push(["scored 0 because", record.error]);
  for (const [name, value] of items) {
    const span = document.createElement("span");
    span.dataset.fact = name;
    span.textContent = `${name}: ${value}`;
    facts.append(span);
  }
  const segs = record.segments.map((seg) => {
    const div = document.createElement("div");
    div.className = `traj-seg traj-seg-${seg.role}`;
    Object.assign(div.dataset, { role: seg.role, turn: seg.turn ?? "", toolCall: seg.tool_call ? "1" : "0" });
    const label = document.createElement("div");
    label.className = "traj-seg-label";
    label.textContent = `${segmentLabel(seg)} · ${seg.tokens} tokens${seg.cut ? " · cut (the middle is left out)" : ""}`;
    const pre = document.createElement("pre");
    pre.textContent = seg.text;
    div.append(label, pre);
    return div;
  });
  box.replaceChildren(facts, ...segs);
  box.dataset.traj = String(record.traj);
  box.hidden = false;
}
