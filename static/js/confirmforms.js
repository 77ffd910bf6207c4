// A form with data-confirm="question" asks first (a destructive POST is one click away otherwise).
for (const form of document.querySelectorAll("form[data-confirm]")) {
  form.addEventListener("submit", (ev) => {
    if (!window.confirm(form.dataset.confirm)) ev.preventDefault();
  });
}
