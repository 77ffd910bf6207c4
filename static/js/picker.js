// Run pickers (the compare page's, the runs list's ticks): the checked runs become
// ``?runs=1,2,3`` (2 to 12 of them, controller/comparisons/compare.py MIN_COMPARED/MAX_COMPARED). A box may sit outside its form (``form="..."``, the runs
// list's rows): form.elements holds it either way.
const MIN_RUNS = 2, MAX_RUNS = 12;

for (const form of document.querySelectorAll("form[data-run-picker]")) {
  const boxes = [...form.elements].filter((e) => e.type === "checkbox");
  const hidden = form.querySelector("input[name=runs]");
  const button = form.querySelector("button[type=submit]");
  const note = form.querySelector("#picker-note");
  const update = () => {
    const ids = boxes.filter((b) => b.checked).map((b) => b.value);
    hidden.value = ids.join(",");
    const ok = ids.length >= MIN_RUNS && ids.length <= MAX_RUNS;
    button.disabled = !ok;
    note.textContent = ok ? `${ids.length} runs selected` : `select ${MIN_RUNS} to ${MAX_RUNS} runs (${ids.length} selected)`;
  };
  boxes.forEach((b) => b.addEventListener("change", update));
  update();
}
