// Compare page run picker: the checked runs become ``?runs=1,2,3`` (2 to 4 of them).
const MIN_RUNS = 2, MAX_RUNS = 4;

const form = document.getElementById("compare-picker");
if (form) {
  const boxes = [...form.querySelectorAll("input[type=checkbox]")];
  const hidden = form.querySelector("input[name=runs]");
  const button = form.querySelector("button[type=submit]");
  const note = document.getElementById("picker-note");
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
