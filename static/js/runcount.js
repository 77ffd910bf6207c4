// Experiment page: the compare form says how many runs it launches before it does: ticked
// schedules × sweep values (1 without a sweep) × repeats (controller/forms.py ComparisonForm, whose
// repeats input carries the defaults and the limit as data attributes).
const form = document.getElementById("comparison-form");
const note = document.getElementById("comparison-run-count");

function runCount() {
  const schedules = form.querySelectorAll("input[name=schedules]:checked").length;
  const field = form.elements.sweep_field?.value.trim() ?? "";
  const raw = form.elements.sweep_values?.value.trim() ?? "";
  const values = raw ? raw.split(",").filter((v) => v.trim()).length : 0;
  const repeatsInput = form.elements.repeats;
  const typed = repeatsInput.value.trim();
  const repeats = typed ? Number(typed) : Number(field || raw ? repeatsInput.dataset.sweepDefault : repeatsInput.dataset.default);
  return { schedules, values, repeats, runs: schedules * Math.max(values, 1) * repeats, max: Number(repeatsInput.dataset.maxRuns) };
}

function update() {
  const c = runCount();
  if (!Number.isInteger(c.repeats) || c.repeats < 1) {
    note.textContent = "repeats: a whole number of runs per schedule";
    return;
  }
  const parts = [`${c.schedules} schedule${c.schedules === 1 ? "" : "s"}`];
  if (c.values) parts.push(`${c.values} values`);
  parts.push(`${c.repeats} repeat${c.repeats === 1 ? "" : "s"}`);
  note.textContent = `launches ${c.runs} run${c.runs === 1 ? "" : "s"} (${parts.join(" × ")})`
    + (c.runs > c.max ? `: more than the ${c.max} a comparison holds` : "");
  note.dataset.runs = String(c.runs);
}

if (form && note && form.elements.repeats) {
  form.addEventListener("input", update);
  form.addEventListener("change", update);
  update();
}
