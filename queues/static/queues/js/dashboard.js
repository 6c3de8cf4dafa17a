// QueueAdmin dashboard behaviour. Page JavaScript lives only in static files (the CSP has no
// 'unsafe-inline'), and htmx runs with allowEval off, so this file does what trigger filters
// would otherwise do.
(function () {
  "use strict";
  var TICK_MS = 5000;

  // Live regions listen for "queueadmin:tick" on <body>; it is sent only while the tab is
  // visible, so a background tab costs the server nothing.
  function tick() {
    if (document.visibilityState === "visible" && window.htmx) {
      htmx.trigger(document.body, "queueadmin:tick");
    }
  }
  setInterval(tick, TICK_MS);
  document.addEventListener("visibilitychange", tick);

  // The connection indicator on live regions: text, not only colour.
  function setConnection(ok) {
    document.querySelectorAll("[data-connection]").forEach(function (el) {
      el.dataset.state = ok ? "live" : "offline";
      el.textContent = ok ? "Live" : "Connection lost, retrying";
    });
  }
  document.addEventListener("htmx:afterRequest", function (event) {
    var status = event.detail.xhr ? event.detail.xhr.status : 0;
    setConnection(status > 0 && status < 500);
  });
  document.addEventListener("htmx:sendError", function () { setConnection(false); });

  // An action's form or button is busy while its request runs: pressed once, sent once.
  function actionButtons(elt) {
    if (elt.tagName === "FORM") { return Array.prototype.slice.call(elt.querySelectorAll("button")); }
    return elt.tagName === "BUTTON" ? [elt] : [];
  }
  document.addEventListener("htmx:beforeRequest", function (event) {
    actionButtons(event.detail.elt).forEach(function (button) {
      button.disabled = true;
      button.setAttribute("aria-busy", "true");
    });
  });
  document.addEventListener("htmx:afterRequest", function (event) {
    actionButtons(event.detail.elt).forEach(function (button) {
      button.disabled = false;
      button.removeAttribute("aria-busy");
    });
  });
  // Plain (non-htmx) posts navigate away: their buttons stay pressed until the next page.
  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (form.method === "post" && !form.hasAttribute("hx-post")) {
      setTimeout(function () { actionButtons(form).forEach(function (b) { b.disabled = true; }); }, 0);
    }
  });

  // hx-confirm asks in the page's own dialog, not the browser's confirm().
  document.addEventListener("htmx:confirm", function (event) {
    var dialog = document.getElementById("confirm-dialog");
    if (!event.detail.question || !dialog || !dialog.showModal) { return; }
    event.preventDefault();
    document.getElementById("confirm-dialog-text").textContent = event.detail.question;
    document.getElementById("confirm-dialog-ok").textContent =
      event.detail.elt.getAttribute("data-confirm-label") || "Confirm";
    dialog.returnValue = "";
    dialog.addEventListener("close", function answered() {
      dialog.removeEventListener("close", answered);
      if (dialog.returnValue === "confirm") { event.detail.issueRequest(true); }
    });
    dialog.showModal();
  });

  // The item list's select-all box selects the page, then offers every matching item.
  document.addEventListener("change", function (event) {
    var box = event.target;
    if (!box.matches || !box.matches("[data-select-page]")) { return; }
    var list = box.closest("section") || document;
    list.querySelectorAll('input[name="ids"]').forEach(function (row) { row.checked = box.checked; });
    list.querySelectorAll("[data-select-more]").forEach(function (more) { more.hidden = !box.checked; });
  });

  // What an action did, said in a status line for a few seconds (the server sends the words).
  var toastTimer = null;
  document.body.addEventListener("queueadmin:toast", function (event) {
    var toast = document.getElementById("toast");
    if (!toast || !event.detail || !event.detail.message) { return; }
    toast.textContent = event.detail.message;
    toast.dataset.kind = event.detail.ok === false ? "error" : "ok";
    toast.hidden = false;
    clearTimeout(toastTimer);
    toastTimer = setTimeout(function () { toast.hidden = true; }, 6000);
  });
})();
