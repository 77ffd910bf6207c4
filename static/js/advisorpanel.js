// Run page: the schedule advisor and the drain's decisions (GET /api/runs/<id>/advice/;
// controller/comparisons/advisor.py, controller/comparisons/drain.py; docs/pages-run.md "Schedule advisor"). Fetched once the
// run has finished (live.js keeps #run-app's data-status current); every text is set as text.
import { getJSON } from "./fetchjson.js";

const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);
const app = document.getElementById("run-app");
const $ = (id) => document.getElementById(id);
const secs = (v) => (v === null || v === undefined ? "—" : `${v.toFixed(3)} s`);
const pct = (v) => `${(100 * v).toFixed(0)}%`;

function cell(tag, text, attrs = {}) {
  const el = document.createElement(tag);
  el.textContent = text;
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  return el;
}

function drawAdvisor(a, note) {
  const panel = $("advisor-panel");
  panel.dataset.state = a ? "ready" : "none";
  $("advisor-sentence").textContent = a ? a.advice : note;
  $("advisor-table").hidden = !a;
  $("advisor-facts").hidden = !a;
  if (!a) return;
  const head = document.createElement("thead"), body = document.createElement("tbody");
  head.append(document.createElement("tr"));
  head.firstChild.append(...["Schedule", "Predicted step", "vs sync", "Learner idle", "Rollout idle", "Staleness mean / max"]
    .map((t, i) => cell("th", t, i ? { class: "num" } : {})));
  for (const s of a.schedules) {
    const row = document.createElement("tr");
    row.dataset.schedule = s.schedule;
    const own = s.schedule === a.schedule;
    row.append(
      cell("td", own ? `${s.schedule} (this run: measured ${secs(a.measured_step_s)})` : s.schedule),
      cell("td", secs(s.step_s), { class: "num", "data-field": "step_s", "data-value": String(s.step_s) }),
      cell("td", `${s.speedup_vs_sync.toFixed(2)}×`, { class: "num", "data-field": "speedup_vs_sync" }),
      cell("td", pct(s.learner_idle), { class: "num", "data-field": "learner_idle" }),
      cell("td", pct(s.rollout_idle), { class: "num", "data-field": "rollout_idle" }),
      cell("td", `${s.staleness_mean.toFixed(2)} / ${s.staleness_max}`, { class: "num", "data-field": "staleness" }),
    );
    if (own) row.className = "own";
    body.append(row);
  }
  $("advisor-table").replaceChildren(head, body);
  const b = a.breakdown;
  const ratio = a.rl_ratio === null ? "—" : a.rl_ratio.toFixed(2);
  const error = a.model_error === null ? "no measured step to hold it against"
    : `simulated ${secs(a.simulated_step_s)} vs measured ${secs(a.measured_step_s)} (${a.model_error >= 0 ? "+" : ""}${(100 * a.model_error).toFixed(0)}%)`;
  $("advisor-rl").textContent = `${a.regime}: R = ${secs(a.rollout_s)} (a batch's rollout alone), L = ${secs(a.learner_s)} (its learner work alone), R/L = ${ratio}.`;
  $("advisor-breakdown").textContent = `Where a sync step goes: rollout ${secs(b.rollout_s)} · backward and group closes ${secs(b.backward_s)} · optimizer and publish ${secs(b.barrier_s)} (no schedule hides these).`;
  $("advisor-error").textContent = `The model on this run's own schedule (${a.schedule}): ${error}, over steps ${a.first_step}–${a.first_step + a.steps_replayed - 1} (${a.rollout_slots} rollout slots, ${a.learner_ranks} learner rank${a.learner_ranks === 1 ? "" : "s"}).`;
  $("advisor-error").dataset.value = a.model_error === null ? "" : String(a.model_error);
}

function drawDrain(d) {
  const section = $("drain-panel");
  section.hidden = !d;
  if (!d) return;
  $("drain-headline").textContent = d.headline;
  const items = d.notes.map((n) => cell("li", n.sentence, { "data-step": String(n.step) }));
  if (d.more) items.push(cell("li", `… and ${d.more} more step${d.more === 1 ? "" : "s"} like these.`));
  $("drain-notes").replaceChildren(...items);
}

async function load() {
  const body = await getJSON(`${app.dataset.apiBase}advice/`);
  drawAdvisor(body.advisor, body.advisor_note);
  drawDrain(body.drain);
}

async function main() {
  if (!TERMINAL.has(app.dataset.status)) {
    $("advisor-sentence").textContent = "The advisor replays the run's spans once it has finished.";
    await new Promise((resolve) => {
      const timer = setInterval(() => { if (TERMINAL.has(app.dataset.status)) { clearInterval(timer); resolve(); } }, 2000);
    });
  }
  await load();
}

main().catch((err) => {
  $("advisor-panel").dataset.state = "error";
  $("advisor-sentence").textContent = `Could not load the advisor: ${err.message}`;
});
