// The run page's trace export link: the step range inputs set ?step_from=&step_to= on it
// (GET /api/runs/<id>/trace.json, docs/web-contract.md).
const box = document.getElementById("trace-export");
if (box) {
  const link = document.getElementById("trace-link");
  const from = document.getElementById("trace-from"), to = document.getElementById("trace-to");
  const update = () => {
    const query = new URLSearchParams();
    if (from.value !== "") query.set("step_from", from.value);
    if (to.value !== "") query.set("step_to", to.value);
    const text = query.toString();
    link.href = text ? `${box.dataset.base}?${text}` : box.dataset.base;
    link.download = `trace${from.value !== "" || to.value !== "" ? `-steps-${from.value || 0}-${to.value || "end"}` : ""}.json`;
  };
  from.addEventListener("input", update);
  to.addEventListener("input", update);
}
