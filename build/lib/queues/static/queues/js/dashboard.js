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
})();
