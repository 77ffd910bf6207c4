// Compare page, per schedule: a comparison's repeats pooled, from the summary's ``pooled`` rows
// (controller/comparisons/pooled.py; docs/pages-compare.md, "Pooled over repeats"), and the trained-distribution
// warnings. Every cell keeps the API's number in data-value; the text is it formatted.

const dash = "—";
const interval = (ci, format) => (ci ? ` [${format(ci[0])}, ${format(ci[1])}]` : "");
const seconds = (v) => v.toFixed(3);
const ratio = (v) => v.toFixed(2);

function cell(tag, text, attrs = {}) {
  const el = document.createElement(tag);
  el.textContent = text;
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  return el;
}

function groupRow(g) {
  const row = document.createElement("tr");
  row.dataset.schedule = g.schedule;
  row.dataset.runs = g.runs.join(",");
  const step = g.step_s === null ? dash : `${seconds(g.step_s)} s${interval(g.step_ci90, seconds)}`;
  // ≈: the speedup's interval admits 1, so this ratio shows no difference
  const speedup = g.speedup_vs_sync === null ? dash
    : `${g.speedup_spans_one ? "≈ " : ""}${ratio(g.speedup_vs_sync)}×${interval(g.speedup_ci90, ratio)}`;
  const length = g.response_length_vs_sync === null ? dash
    : `${ratio(g.response_length_vs_sync)}×${interval(g.response_length_vs_sync_ci90, ratio)}`;
  const value = (v) => (v === null ? "" : String(v));
  row.append(
    cell("td", g.label), cell("td", String(g.runs.length), { class: "num", "data-field": "runs" }),
    cell("td", String(g.steps), { class: "num", "data-field": "steps" }),
    cell("td", step, { class: "num", "data-field": "step_s", "data-value": value(g.step_s) }),
    cell("td", speedup, {
      class: `num${g.speedup_spans_one ? " spans-one" : ""}`, "data-field": "speedup_vs_sync",
      "data-value": value(g.speedup_vs_sync), "data-spans-one": g.speedup_spans_one ? "1" : "0",
      title: g.speedup_spans_one ? "its 90% interval admits 1: no difference shown" : "",
    }),
    cell("td", length, { class: "num", "data-field": "response_length_vs_sync", "data-value": value(g.response_length_vs_sync) }),
    // the window per batch produced: charges a window that trained work done before it
    cell("td", g.step_equal_work_s === null ? dash : `${seconds(g.step_equal_work_s)} s`,
      { class: "num", "data-field": "step_equal_work_s", "data-value": value(g.step_equal_work_s) }),
    cell("td", g.slowest_decile_share === null ? dash : `${(100 * g.slowest_decile_share).toFixed(0)}%`, {
      class: "num", "data-field": "slowest_decile_share", "data-value": value(g.slowest_decile_share),
      title: g.slowest_decile_tokens === null ? "" : `trajectories of ${g.slowest_decile_tokens}+ generated tokens (sync's slowest decile)`,
    }),
  );
  return row;
}

/** Fills the pooled table (shown when some schedule has two runs or more) and the trained warnings. */
export function drawPooled(panel, table, warnings, summary) {
  const pooled = summary.pooled ?? [];
  const head = document.createElement("thead"), body = document.createElement("tbody");
  const titles = ["Schedule", "Runs", "Steps", "Median step [90%]", "Speedup vs sync [90%]", "Response length vs sync [90%]",
    "Equal-work step", "Slowest decile trained"];
  head.append(document.createElement("tr"));
  head.firstChild.append(...titles.map((t, i) => cell("th", t, i ? { class: "num" } : {})));
  body.append(...pooled.map(groupRow));
  table.replaceChildren(head, body);
  panel.hidden = !pooled.some((g) => g.runs.length > 1);
  warnings.replaceChildren(...(summary.trained_warnings ?? []).map((w) => cell("li", w)));
  warnings.hidden = !warnings.children.length;
}
