// Console behaviour that would otherwise be inline handlers or htmx expressions, both of which
// the Content-Security-Policy refuses (no inline script, no eval).

// A form with data-confirm="…" asks before it submits.
document.addEventListener("submit", (event) => {
  const form = event.target.closest("form[data-confirm]");
  if (form && !window.confirm(form.dataset.confirm)) {
    event.preventDefault();
  }
});

// Live panels ("every Ns" triggers) poll only while the tab is visible; a panel's first
// load still happens in a tab opened in the background.
document.addEventListener("htmx:confirm", (event) => {
  const trigger = event.detail.triggeringEvent;
  if (document.visibilityState === "hidden" && !(trigger && trigger.type === "load")) {
    event.preventDefault();
  }
});

// A button with data-copy="<id>" copies that element's text (a route's URL, a curl example).
document.addEventListener("click", (event) => {
  const button = event.target.closest("button[data-copy]");
  const source = button && document.getElementById(button.dataset.copy);
  if (source && navigator.clipboard) {
    navigator.clipboard.writeText(source.textContent.trim()).then(() => {
      const label = button.textContent;
      button.textContent = "Copied";
      setTimeout(() => { button.textContent = label; }, 1500);
    });
  }
});
