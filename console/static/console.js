// The console's only script. Every page works without it; with it: a copy button for a new key, the
// header's switch to the browser's own time zone, and filter forms that apply as soon as a menu or a
// date changes (no button to press as well).
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  for (const button of document.querySelectorAll("[data-copy]")) {
    const target = document.querySelector(button.dataset.copy);
    const status = button.parentElement.querySelector(".copied");
    button.hidden = false;
    button.addEventListener("click", async () => {
      try {
        await navigator.clipboard.writeText(target.textContent.trim());
        status.textContent = "Copied.";
      } catch (error) {
        const range = document.createRange();
        range.selectNodeContents(target);
        const selection = window.getSelection();
        selection.removeAllRanges();
        selection.addRange(range);
        status.textContent = "Selected: press Ctrl+C (⌘C) to copy.";
      }
    });
  }
  const zone = Intl.DateTimeFormat().resolvedOptions().timeZone;
  for (const form of document.querySelectorAll("[data-zone-switch]")) {
    form.elements.browser.value = zone || "";
    const local = form.querySelector("[data-local]");
    if (local && zone && !["UTC", "Etc/UTC", "Etc/GMT", "GMT"].includes(zone)) {
      local.hidden = false;
      local.textContent = `Show ${zone} time`;
    }
  }
  for (const form of document.querySelectorAll("form[data-autosubmit]")) {
    for (const field of form.querySelectorAll("select, input[type=date]")) {
      field.addEventListener("change", () => {
        if (field.type !== "date" || !field.value || field.checkValidity()) form.requestSubmit();
      });
    }
  }
});
