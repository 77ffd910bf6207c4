// A step's trajectories as a sortable table (by-trajectory lanes): per trajectory its group,
// turns, sampled tokens, rollout time (first rollout span's start to the last one's end), the
// wait from its last rollout span to its backward, and what the learner did with it (trained,
// skipped, not trained yet; drafted), from the spans the page holds; its reward and advantage from
// the learner's trajectory records (static/js/trajrecords.js). A click on a header sorts, on a row
// follows that trajectory.
import { KIND } from "./conventions.js";
import { isLearnerKind } from "./spans.js";

const COLUMNS = [ // [key, header, format]
  ["traj", "Trajectory", String], ["group", "Group", String], ["turns", "Turns", String], ["tokens", "Tokens", String],
  ["rollout_ms", "Rollout ms", (v) => v.toFixed(1)], ["wait_ms", "To backward ms", (v) => v.toFixed(1)],
  ["reward", "Reward", (v) => v.toFixed(3)], ["advantage", "Advantage", (v) => v.toFixed(3)],
  ["state", "Learner", String],
];

/** One row per trajectory of ``step`` (the by-trajectory lanes' trajectories); ``stepDone``: the
 * learner is past the step, so one without a backward was skipped; ``records``: Map traj -> the
 * learner's record (reward, advantage), or null before they arrive. */
export function trajectoryRows(spans, trajs, stepDone, records = null) {
  const rows = new Map([...trajs].map((t) => [t, { traj: t, group: null, turns: 0, tokens: 0, t0: Infinity, t1: -Infinity,
    backward: null, drafted: false }]));
  for (const s of spans) {
    const row = rows.get(s.traj);
    if (!row) continue;
    row.group = s.group ?? row.group;
    if (s.kind === KIND.BACKWARD) { row.backward = s; continue; }
    if (isLearnerKind(s.kind)) continue;
    if (s.kind === KIND.GENERATE || s.kind === KIND.DRAFT) { row.turns++; row.tokens += s.tokens ?? 0; }
    if (s.kind === KIND.DRAFT) row.drafted = true;
    row.t0 = Math.min(row.t0, s.t0);
    row.t1 = Math.max(row.t1, s.t1);
  }
  return [...rows.values()].map((r) => ({
    traj: r.traj, group: r.group ?? "–", turns: r.turns, tokens: r.tokens,
    rollout_ms: Number.isFinite(r.t0) ? (r.t1 - r.t0) * 1000 : null,
    wait_ms: r.backward && Number.isFinite(r.t1) ? (r.backward.t0 - r.t1) * 1000 : null,
    reward: records?.get(r.traj)?.reward ?? null, advantage: records?.get(r.traj)?.advantage ?? null,
    state: (r.backward ? "trained" : stepDone ? "skipped" : "not trained yet") + (r.drafted ? " · drafted" : ""),
  }));
}

export class TrajectoryTable {
  constructor(table, onPick = () => {}) {
    Object.assign(this, { table, onPick, rows: [], sortKey: "traj", ascending: true });
  }

  show(rows) {
    this.rows = rows;
    this.render();
  }

  sortBy(key) {
    this.ascending = this.sortKey === key ? !this.ascending : true;
    this.sortKey = key;
    this.render();
  }

  render() {
    const { sortKey: key, ascending } = this;
    const value = (r) => (r[key] === null ? -Infinity : r[key]);
    const sorted = [...this.rows].sort((a, b) => (value(a) < value(b) ? -1 : value(a) > value(b) ? 1 : 0) * (ascending ? 1 : -1));
    const head = document.createElement("tr");
    for (const [k, text] of COLUMNS) {
      const th = document.createElement("th");
      th.textContent = text + (k === key ? (ascending ? " ▲" : " ▼") : "");
      th.dataset.key = k;
      th.className = "sortable";
      th.addEventListener("click", () => this.sortBy(k));
      head.append(th);
    }
    const body = document.createElement("tbody");
    for (const r of sorted) {
      const tr = document.createElement("tr");
      tr.dataset.traj = String(r.traj);
      tr.addEventListener("click", () => this.onPick(r.traj));
      for (const [k, , format] of COLUMNS) {
        const td = document.createElement("td");
        td.textContent = r[k] === null ? "—" : format(r[k]);
        td.dataset.key = k;
        tr.append(td);
      }
      body.append(tr);
    }
    const thead = document.createElement("thead");
    thead.append(head);
    this.table.replaceChildren(thead, body);
    this.table.hidden = !this.rows.length;
    this.table.dataset.sort = `${key}:${ascending ? "asc" : "desc"}`;
  }
}
