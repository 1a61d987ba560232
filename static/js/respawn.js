// The little the dashboard needs beyond htmx, under a strict CSP (no inline script, no
// eval): bulk selection, errors shown next to what was clicked, previews that open where
// they were asked for and close again, a notice after an action, and timeline clicks that
// open their step. Everything works without it too: forms post and links navigate.
"use strict";

(function () {
  // --- Bulk selection on the session list -------------------------------------------------
  function selectionBoxes() {
    return document.querySelectorAll("input[name=ids][form=bulk-form]");
  }

  function countSelection() {
    const count = Array.from(selectionBoxes()).filter((box) => box.checked).length;
    const matching = document.querySelector("[data-select-matching]");
    // How many match, as the pager says it ("of 130", "of about 20,000"), once counted.
    const listed = document.getElementById("listed");
    const total = listed ? listed.textContent.trim().replace(/^of /, "") : "";
    document.querySelectorAll("[data-matching-count]").forEach((el) => { el.textContent = total; });
    document.querySelectorAll("[data-selected-count]").forEach((el) => {
      el.textContent = matching && matching.checked ? (total ? `all ${total}` : "all matching") : String(count);
    });
  }

  document.addEventListener("change", (event) => {
    const target = event.target;
    if (!(target instanceof HTMLInputElement)) return;
    const matching = document.querySelector("[data-select-matching]");
    if (target.matches("[data-select-matching]")) {
      // Every session the filters match: the page's boxes are ticked to show it.
      selectionBoxes().forEach((box) => { box.checked = target.checked; });
      document.querySelectorAll("[data-select-all]").forEach((box) => { box.checked = target.checked; });
    } else if (target.matches("[data-select-all]")) {
      selectionBoxes().forEach((box) => { box.checked = target.checked; });
      if (!target.checked && matching) matching.checked = false;
    } else if (target.matches("input[name=ids]") && !target.checked && matching) {
      matching.checked = false;
    }
    if (target.matches("[data-select-all], [data-select-matching], input[name=ids]")) countSelection();
  });

  // --- A choice that fills in a field: the correction form starts from the chosen tool
  // result's current output (each option carries it; empty when too long to fill in).
  document.addEventListener("change", (event) => {
    const select = event.target;
    if (!(select instanceof HTMLSelectElement) || !select.dataset.prefills) return;
    const field = select.form && select.form.elements.namedItem(select.dataset.prefills);
    const option = select.selectedOptions[0];
    if (!(field instanceof HTMLTextAreaElement) || !option) return;
    field.value = option.dataset.prefill || "";
    field.placeholder = option.dataset.prefill
      ? ""
      : `too long to fill in here: see step #${option.value} in the trace`;
  });

  // --- Errors: never swapped into the page, always shown next to the action ---------------
  function errorText(xhr) {
    if (!xhr) return "Could not reach the server: check the connection and try again.";
    // The dashboard's own errors say what went wrong in a header; nothing else is read
    // from an error answer (a page may be anything, and is never parsed or shown).
    const said = xhr.getResponseHeader("X-Respawn-Error");
    if (said) {
      try {
        return decodeURIComponent(said);
      } catch (_) {
        return said;
      }
    }
    if (xhr.status >= 500) {
      return `Server error (${xhr.status}): it may not have completed. Reload to see where things stand.`;
    }
    if (xhr.status === 403) return "Refused (403): you may have been logged out; reload the page.";
    if (xhr.status === 404) return "Not found (404): it may have been deleted; reload the page.";
    return `Refused (${xhr.status}).`;
  }

  function isPolling(elt) {
    const trigger = elt.getAttribute("hx-trigger") || "";
    return /\bevery\b|\bload\b|\brevealed\b|from:body/.test(trigger);
  }

  function errorSlot(elt, create) {
    const scope = elt.closest("form") || elt;
    let slot = scope.querySelector(".form-error");
    if (!slot && create) {
      slot = document.createElement("p");
      slot.className = "form-error";
      slot.setAttribute("role", "alert");
      slot.dataset.made = "1";
      elt.insertAdjacentElement("afterend", slot);
    }
    return slot;
  }

  function showError(elt, text) {
    if (!elt || !elt.isConnected || !elt.getClientRects().length) {
      // The button is gone (a poll redrew its part while the request was out) or hidden:
      // the refusal is still the operator's to read.
      showNotice(text);
      return;
    }
    if (isPolling(elt) && !elt.closest("form")) {
      // A refresh that failed: keep what is shown, mark it as possibly out of date.
      elt.classList.add("stale");
      elt.title = `Not refreshed: ${text}`;
      if (elt.matches("#timeline, #usage, #charts, li.more")) {
        elt.replaceChildren(Object.assign(document.createElement("p"), {
          className: "form-error",
          textContent: text,
        }));
      }
      return;
    }
    const slot = errorSlot(elt, true);
    slot.textContent = text;
    slot.hidden = false;
  }

  function clearError(elt) {
    if (!elt) return;
    elt.classList.remove("stale");
    const slot = errorSlot(elt, false);
    if (slot) {
      slot.hidden = true;
      slot.textContent = "";
    }
  }

  document.addEventListener("htmx:beforeRequest", (event) => {
    const elt = event.detail.elt;
    const result = document.getElementById("bulk-result");
    if (result && result.dataset.stopped && elt.closest("[data-bulk-next]")) {
      // Stopped: a batch that was on its way when the operator stopped asks for no more.
      if (!(event.detail.triggeringEvent && event.detail.triggeringEvent.type === "submit")) {
        event.preventDefault();
        return;
      }
    }
    if (result && (elt.closest("form.confirm") || (event.detail.triggeringEvent && event.detail.triggeringEvent.type === "submit"))) {
      delete result.dataset.stopped;
    }
    clearError(elt);
  });

  document.addEventListener("htmx:beforeSwap", (event) => {
    const detail = event.detail;
    const xhr = detail.xhr;
    const elt = (detail.requestConfig && detail.requestConfig.elt) || detail.elt;
    if (xhr && xhr.status >= 400) {
      detail.shouldSwap = false;
      detail.isError = false; // shown here; htmx need not log it as well
      const text = errorText(xhr);
      showError(elt, text);
      if (detail.requestConfig && detail.requestConfig.verb !== "get") {
        // A refused action is also told in the notice: the live page may redraw the part
        // that holds its button (the session moved on: that is often why it was refused).
        showNotice(text);
      }
      return;
    }
    // One preview open at a time, in the slot next to the button that asked for it.
    const target = detail.target;
    if (target && target.matches(".slot, .dialog-slot")) {
      document.querySelectorAll(".slot, .dialog-slot").forEach((slot) => {
        if (slot !== target) slot.replaceChildren();
      });
    }
  });

  document.addEventListener("htmx:sendError", (event) => showError(event.detail.elt, errorText(null)));
  document.addEventListener("htmx:timeout", (event) => showError(event.detail.elt, "The server took too long to answer; try again."));

  // --- Previews and reports close again ---------------------------------------------------
  function showStopped(next) {
    const report = next.closest("[data-bulk-progress]");
    if (report) report.querySelectorAll("[data-going-on]").forEach((el) => el.remove());
    next.replaceWith(Object.assign(document.createElement("p"), {
      className: "muted",
      textContent: "Stopped: the sessions not reached yet were left as they were.",
    }));
  }

  document.addEventListener("click", (event) => {
    const button = event.target instanceof Element ? event.target.closest("[data-dismiss]") : null;
    if (!button) return;
    const next = button.closest("[data-bulk-next]");
    if (next) {
      // Stop a bulk action going batch by batch: no further batch is asked for.
      const result = document.getElementById("bulk-result");
      if (result) result.dataset.stopped = "1";
      showStopped(next);
      return;
    }
    const box = button.closest(".preview-box, .bulk-report, form.confirm");
    if (box) box.remove();
  });

  document.addEventListener("keydown", (event) => {
    if (event.key !== "Escape") return;
    document.querySelectorAll(".preview-box").forEach((box) => box.remove());
    hideNotice();
  });

  // --- Notices after an action (HX-Trigger: respawn-notice) -------------------------------
  // A tap or Escape dismisses it at once: on a narrow screen it covers what is below it.
  let toastTimer = null;
  function hideNotice() {
    const toast = document.getElementById("toast");
    if (toast) toast.hidden = true;
    clearTimeout(toastTimer);
  }
  document.addEventListener("click", (event) => {
    if (event.target instanceof Element && event.target.closest("#toast")) hideNotice();
  });
  function showNotice(text) {
    const toast = document.getElementById("toast");
    if (!toast || !text) return;
    toast.textContent = text;
    toast.hidden = false;
    clearTimeout(toastTimer);
    toastTimer = setTimeout(() => { toast.hidden = true; }, 6000);
  }
  document.body.addEventListener("respawn-notice", (event) => {
    if (event.detail) showNotice(event.detail.text);
  });

  // --- Requests that need a little more than their URL ------------------------------------
  document.addEventListener("htmx:configRequest", (event) => {
    const elt = event.detail.elt;
    if (elt.hasAttribute("data-trace-refresh")) {
      // Redraw the trace in place: as far as it was read, not just its first page.
      const steps = elt.querySelectorAll("#trace-list > li.step");
      const last = steps.length ? steps[steps.length - 1].dataset.seq : "";
      if (last) event.detail.parameters.upto = last;
    }
    if (elt.hasAttribute("data-clean-query")) {
      // Only the filters that say something go into the request and the address bar.
      const params = event.detail.parameters;
      Object.keys(params).forEach((name) => {
        const value = params[name];
        if (value === "" || (Array.isArray(value) && value.every((v) => v === ""))) delete params[name];
      });
    }
    const cause = event.detail.triggeringEvent && event.detail.triggeringEvent.type;
    if (elt.hasAttribute("data-counts") && (cause === "sessions-changed" || cause === "sessions-settled")) {
      event.detail.parameters.fresh = "1"; // a session changed: count again, now
    }
  });

  // --- Going to a step --------------------------------------------------------------------
  function openStep(seq, scroll) {
    const li = document.getElementById(`step-${seq}`);
    if (!li) return false;
    const details = li.querySelector(":scope > details");
    if (details) details.open = true;
    document.querySelectorAll("#trace-list > li.focus").forEach((el) => el.classList.remove("focus"));
    li.classList.add("focus");
    if (scroll) li.scrollIntoView({ block: "center" });
    return true;
  }

  document.addEventListener("click", (event) => {
    if (!(event.target instanceof Element)) return;
    const zoom = event.target.closest("[data-zoom]");
    if (zoom && window.htmx) {
      event.preventDefault();
      window.htmx.ajax("GET", zoom.getAttribute("data-zoom"), { target: "#timeline", swap: "innerHTML" });
      return;
    }
    const link = event.target.closest("[data-step]");
    if (link && openStep(link.getAttribute("data-step"), true)) {
      event.preventDefault();
      history.replaceState(null, "", `#step-${link.getAttribute("data-step")}`);
    }
    // Otherwise the link loads the trace from that step.
  });

  function openFromHash() {
    const match = /^#step-(\d+)$/.exec(location.hash);
    if (match) openStep(match[1], false);
  }
  window.addEventListener("hashchange", openFromHash);
  document.addEventListener("DOMContentLoaded", openFromHash);

  document.addEventListener("htmx:afterSettle", (event) => {
    const target = event.detail.target;
    if (target && target.id === "trace") {
      const focus = document.querySelector("#trace-list > li.focus");
      if (focus) focus.scrollIntoView({ block: "center" });
    }
    // Steps arrive a page at a time (and live): a step already shown is never shown twice.
    const seen = new Set();
    document.querySelectorAll("#trace-list > li[id^=step-]").forEach((li) => {
      if (seen.has(li.id)) li.remove();
      else seen.add(li.id);
    });
    if (target && target.querySelector && target.querySelector(".preview-box")) {
      const box = target.querySelector(".preview-box");
      box.scrollIntoView({ block: box.offsetHeight > window.innerHeight ? "start" : "nearest" });
      const confirm = box.querySelector("button.primary");
      if (confirm) confirm.focus({ preventScroll: true });
    }
    if (target && target.id === "bulk-result" && target.dataset.stopped) {
      // The batch that was on its way when the operator stopped: its counts, and no more.
      target.querySelectorAll("[data-bulk-next]").forEach(showStopped);
    }
    if (target && target.id === "bulk-result" && target.querySelector("[data-bulk-progress]") && !target.querySelector("[data-bulk-next]") && !target.dataset.stopped) {
      // Every matching session was acted on: the selection is spent.
      document.querySelectorAll("[data-select-matching], [data-select-all]").forEach((box) => { box.checked = false; });
      selectionBoxes().forEach((box) => { box.checked = false; });
    }
    countSelection();
  });
})();
