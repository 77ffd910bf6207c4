// Compare page summary table: GET /api/compare/ (docs/pages-compare.md, "Compare summary"). Every cell
// keeps the API's raw number in data-value; the text is that number formatted.
import { getJSON } from "./fetchjson.js";

const dash = "—";
const fixed = (digits, unit = "") => (v) => `${v.toFixed(digits)}${unit}`;
const percent = (v) => `${(100 * v).toFixed(1)}%`;
const times = (v) => `${v.toFixed(2)}×`;

// [field, header, format, title]
const COLUMNS = [
  ["steps_done", "Steps", String, "steps with stored metrics"],
  ["step_s", "Median step (p10–p90)", fixed(3, " s"), "median timing_s/step; its 10th–90th percentile over the steps"],
  ["speedup_vs_sync", "Speedup vs sync (p10–p90)", times, "the sync run's median step / this run's; spread: over this run's p90 and p10 step"],
  ["efficiency", "Efficiency", percent, "the work bound / this run's mean step: at most 100% (docs/bench-report.md, Efficiency)"],
  ["learner_idle", "Learner idle", percent, "share of the training window with no learner span"],
  ["rollout_idle", "Rollout idle", percent, "share of the training window with no rollout span"],
  ["staleness_mean", "Staleness mean", fixed(2), "mean of staleness/mean over the steps"],
  ["staleness_max", "Staleness max", fixed(0), "max of staleness/max"],
  ["tail_s", "Tail", fixed(3, " s"), "median time from the last reward to the step's end"],
  ["final_reward", "Final reward", fixed(3), "reward/mean of the last step"],
  ["time_to_reward_s", "Time to reward", fixed(1, " s"), "from the first step's start (boot excluded)"],
  // speculation (docs/speculation.md): shown only when a run drafted
  ["kept_token_share", "Kept draft tokens", percent, "mean speculation/kept_token_share: of the drafted tokens, the share verification kept", true],
  ["whole_draft_share", "Whole drafts kept", percent, "mean speculation/whole_draft_share: drafts kept token for token", true],
  ["drafted_tokens", "Drafted tokens", (v) => v.toFixed(0), "total speculation/drafted_tokens", true],
];

/** The columns to show: every column, less the optional ones no run has a value for. */
const shownColumns = (runs) => COLUMNS.filter(([field, , , , optional]) => !optional || runs.some((r) => r[field] !== null && r[field] !== undefined));

// [p10 field, p90 field] shown beside a median
const SPREAD = { step_s: ["step_p10_s", "step_p90_s"], speedup_vs_sync: ["speedup_p10", "speedup_p90"] };

function cell(tag, text, attrs = {}) {
  const el = document.createElement(tag);
  el.textContent = text;
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  return el;
}

function headerRow(level, columns) {
  const row = document.createElement("tr");
  row.append(cell("th", "Run"), cell("th", "Schedule"));
  for (const [field, header, , title] of columns) {
    const text = field === "time_to_reward_s" && level !== null ? `${header} ≥ ${level.toFixed(3)}` : header;
    row.append(cell("th", text, { title, class: "num" }));
  }
  return row;
}

/** A time-to-reward cell: the time and its step; the run's own level when the runs are timed to
 * several; "at its first step" when it started there; "no rise" for a run that never improved. */
function rewardText(run, level, text) {
  if (run.time_to_reward_s === null) return run.reward_improved === false ? "no rise" : text;
  const to = level === null && run.reward_level !== null ? ` to ≥ ${run.reward_level.toFixed(3)}` : "";
  return `${text}${to} (${run.reward_at_first_step ? "at its first step, " : ""}step ${run.reward_step})`;
}

function runRow(run, reference, columns, level) {
  const row = document.createElement("tr");
  row.dataset.runId = String(run.id);
  row.append(cell("td", run.name + (run.id === reference ? " (reference)" : "")), cell("td", run.schedule));
  for (const [field, , format] of columns) {
    const v = run[field];
    let text = v === null || v === undefined ? dash : format(v);
    if (field === "time_to_reward_s") text = rewardText(run, level, text);
    const [lo, hi] = SPREAD[field] ?? [];
    if (lo && v !== null && run[lo] !== null && run[hi] !== null) text += ` (${format(run[lo])}–${format(run[hi])})`;
    row.append(cell("td", text, { class: "num", "data-field": field, "data-value": v === null ? "" : String(v) }));
  }
  return row;
}

function describe(summary) {
  const s = (v) => (v === null || v === undefined ? dash : `${v.toFixed(3)} s`);
  // the server computes each run's bound (learner.bench.efficiency, as the bench does); this only words it
  const measured = summary.runs.some((run) => run.efficiency !== null && run.efficiency !== undefined);
  const bound = !measured ? "No run stored spans of work: no efficiency."
    : "Efficiency = each run's own bound / its mean step, at most 100%: the least step its own engine and learner "
      + "work allow under its schedule (sync: engine + learner; streaming: max(engine + optimizer and publish, "
      + "learner); async, fully-async, speculation: max(engine, learner)), whatever else is compared.";
  if (summary.reference === null) return `No sync run among these: no speedup. ${bound}`;
  return `${bound} Sync's R = ${s(summary.rollout_s)}, L = ${s(summary.learner_s)} (medians).`;
}

/** The API's fairness warnings (different steps, seeds, configs; unfinished runs; too few steps). */
function drawWarnings(list, warnings) {
  list.replaceChildren(...warnings.map((w) => cell("li", w)));
  list.hidden = !warnings.length;
}

/**
 * Fetches the summary for ``runIds`` (``level`` or the API's default, ``smoothing`` of reward/mean)
 * and fills ``table``, the ``warnings`` list and ``rewardNote`` (the time to reward's sentence). ``comparisonUrl`` (a comparison's own page):
 * its summary from /api/comparisons/<id>/, every run it launched; else /api/compare/?runs=.
 */
export async function drawSummary(table, note, rewardNote, warnings, runIds, level = null, smoothing = null, comparisonUrl = "") {
  const query = new URLSearchParams(comparisonUrl ? {} : { runs: runIds.join(",") });
  if (level !== null) query.set("reward", String(level));
  if (smoothing !== null) query.set("smoothing", String(smoothing));
  const summary = comparisonUrl ? (await getJSON(`${comparisonUrl}?${query}`)).summary : await getJSON(`/api/compare/?${query}`);
  drawWarnings(warnings, summary.warnings);
  const head = document.createElement("thead"), body = document.createElement("tbody");
  const columns = shownColumns(summary.runs);
  head.append(headerRow(summary.reward_level, columns));
  body.append(...summary.runs.map((r) => runRow(r, summary.reference, columns, summary.reward_level)));
  table.replaceChildren(head, body);
  // several levels, none, or a typed one every run had at its first step: said plainly, above the table
  note.textContent = describe(summary);
  rewardNote.textContent = summary.reward_level_note ? `Time to reward: ${summary.reward_level_note}.` : "";
  rewardNote.hidden = !summary.reward_level_note;
  table.dataset.rewardLevel = summary.reward_level === null ? "" : String(summary.reward_level);
  table.dataset.rewardNote = summary.reward_level_note ?? "";
  return summary;
}
