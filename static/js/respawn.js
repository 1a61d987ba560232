// The little the dashboard needs beyond htmx: "select all" for bulk actions, and a live
// count of the selection. No inline scripts anywhere (a strict CSP forbids them).
document.addEventListener("change", (event) => {
  const target = event.target;
  if (!(target instanceof HTMLInputElement)) return;
  const form = target.closest("form[data-bulk]");
  if (!form) return;
  if (target.matches("[data-select-all]")) {
    form.querySelectorAll("input[name=ids]").forEach((box) => { box.checked = target.checked; });
  }
  const count = form.querySelectorAll("input[name=ids]:checked").length;
  form.querySelectorAll("[data-selected-count]").forEach((el) => { el.textContent = String(count); });
});
