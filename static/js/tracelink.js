// The run page's trace export link: the step range inputs set ?step_from=&step_to= on it
// (GET /api/runs/<id>/trace.json, docs/web-contract.md). A range the server would refuse (a step
// below 0 or not whole, first after last) or that holds no step of the run (first past its last step) is said beside the
// inputs and the link does nothing: a download would swallow the server's answer.
const box = document.getElementById("trace-export");
if (box) {
  const link = document.getElementById("trace-link");
  const from = document.getElementById("trace-from"), to = document.getElementById("trace-to");
  const error = document.getElementById("trace-error");
  const lastStep = () => {
    const raw = document.getElementById("run-app")?.dataset.lastStep;
    return raw ? Number(raw) : null;
  };
  // a step is a whole number from 0 (the API answers 400 to -3 or 1.5: say so here)
  const notAStep = (input, name) => {
    if (input.validity.badInput) return `${name}: not a number`;
    const v = input.value === "" ? null : Number(input.value);
    return v !== null && !(Number.isInteger(v) && v >= 0) ? `${name} ${input.value}: steps are numbered 0, 1, 2, …` : "";
  };
  const problem = () => {
    const bad = notAStep(from, "first step") || notAStep(to, "last step");
    if (bad) return bad;
    const lo = from.value === "" ? null : Number(from.value), hi = to.value === "" ? null : Number(to.value);
    const last = lastStep();
    if (lo !== null && hi !== null && lo > hi) return `first step ${lo} is after last step ${hi}`;
    if (lo !== null && last !== null && lo > last) return `the run has no step ${lo}: its last step is ${last}`;
    return "";
  };
  const update = () => {
    const query = new URLSearchParams();
    if (from.value !== "") query.set("step_from", from.value);
    if (to.value !== "") query.set("step_to", to.value);
    const text = query.toString();
    link.href = text ? `${box.dataset.base}?${text}` : box.dataset.base;
    link.download = `trace${from.value !== "" || to.value !== "" ? `-steps-${from.value || 0}-${to.value || "end"}` : ""}.json`;
    const reason = problem();
    error.textContent = reason;
    error.hidden = !reason;
    link.setAttribute("aria-disabled", reason ? "true" : "false");
    box.dataset.invalid = reason ? "1" : "0";
  };
  link.addEventListener("click", (ev) => {
    update();
    if (box.dataset.invalid === "1") ev.preventDefault();
  });
  from.addEventListener("input", update);
  to.addEventListener("input", update);
}
