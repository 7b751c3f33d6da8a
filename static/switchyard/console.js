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

// A button with data-copy="<id>" copies that element's text (a route's URL, a curl example, a
// new token's secret). Where the page may not write the clipboard (plain HTTP to a host other
// than localhost, or a refusal), it selects the text for the user to copy instead.
document.addEventListener("click", (event) => {
  const button = event.target.closest("button[data-copy]");
  const source = button && document.getElementById(button.dataset.copy);
  if (!source) {
    return;
  }
  button.dataset.label = button.dataset.label || button.textContent;
  const say = (text) => {
    button.textContent = text;
    clearTimeout(button.copyTimer);
    button.copyTimer = setTimeout(() => { button.textContent = button.dataset.label; }, 2000);
  };
  const select = () => {
    const range = document.createRange();
    range.selectNodeContents(source);
    window.getSelection().removeAllRanges();
    window.getSelection().addRange(range);
    say("Selected: press Ctrl+C");
  };
  if (navigator.clipboard && window.isSecureContext) {
    navigator.clipboard.writeText(source.textContent.trim()).then(() => say("Copied"), select);
  } else {
    select();
  }
});

// Relative times (<time data-ago="N">, the "ago" filter) keep counting: N seconds when the
// element reached the page, plus the time since, on this browser's own clock, so a clock
// set differently from the server's changes nothing.
const firstSeen = new WeakMap();

function agoText(seconds) {
  if (seconds < 90) return `${seconds} s ago`;
  if (seconds < 90 * 60) return `${Math.floor(seconds / 60)} min ago`;
  if (seconds < 36 * 3600) return `${Math.floor(seconds / 3600)} h ago`;
  return `${Math.floor(seconds / 86400)} d ago`;
}

function tickAgo() {
  const now = performance.now();
  for (const element of document.querySelectorAll("time[data-ago]")) {
    if (!firstSeen.has(element)) firstSeen.set(element, now);
    const seconds = Number(element.dataset.ago) + Math.floor((now - firstSeen.get(element)) / 1000);
    const text = agoText(seconds);
    if (element.textContent !== text) element.textContent = text;
  }
}
tickAgo();
setInterval(tickAgo, 1000);

// Choices that belong to one cluster (data-cluster="<id>", data-follows="<field name>") show
// only while that field of their form picks their cluster; one hidden is unticked. With no
// cluster picked, all show. (Not the hidden attribute: the label's display: block wins.)
function followCluster(form) {
  const picker = form && form.querySelector("select[name=cluster]");
  if (!picker) {
    return;
  }
  for (const input of form.querySelectorAll("input[data-follows=cluster][data-cluster]")) {
    const shown = !picker.value || input.dataset.cluster === picker.value;
    const row = input.closest("label") || input;
    row.style.display = shown ? "" : "none";
    if (!shown) {
      input.checked = false;
    }
  }
}
document.addEventListener("change", (event) => {
  if (event.target.matches("select[name=cluster]")) {
    followCluster(event.target.form);
  }
});
document.addEventListener("DOMContentLoaded", () => {
  for (const input of document.querySelectorAll("input[data-follows=cluster]")) {
    followCluster(input.form);
  }
});
