// The live stream page (templates/queues/stream.html). New rows go on top. The page keeps its
// position in data-position and sends it on every (re)connection or poll, because browsers do
// not always send Last-Event-ID after a server restart.
(function () {
  "use strict";
  var table = document.querySelector("[data-stream]");
  if (!table) { return; }
  var body = document.getElementById("stream-rows");
  var pauseButton = document.getElementById("stream-pause");
  var buffered = document.getElementById("stream-buffered");
  var bufferedSaid = document.getElementById("stream-buffered-said");
  var connection = document.getElementById("stream-connection");
  var notice = document.getElementById("stream-notice");
  var rowCap = parseInt(table.dataset.rowCap, 10);
  var bufferLimit = parseInt(table.dataset.bufferLimit, 10);
  var paused = false;
  var held = [];
  var dropped = 0;  // events in held rows that were let go

  function withPosition(url) {
    var position = table.dataset.position;
    if (!position) { return url; }
    return url + (url.indexOf("?") < 0 ? "?" : "&") + "after=" + encodeURIComponent(position);
  }

  // The connection's state, and whether the view shows what it brings: a frozen view still
  // receives, so "Live" alone would say new rows appear.
  var connectionText = "";
  function setConnection(state, text) {
    connection.dataset.state = state;
    connectionText = text;
    connection.textContent = paused ? text + " (view frozen)" : text;
  }

  function rowsOf(html) {
    var template = document.createElement("template");
    template.innerHTML = html;
    return Array.prototype.slice.call(template.content.querySelectorAll("tr"));
  }

  // Rows arrive oldest first; each goes on top, so the newest ends up first.
  function show(rows) {
    rows.forEach(function (row) { body.insertBefore(row, body.firstChild); });
    while (body.rows.length > rowCap) { body.deleteRow(-1); }
  }

  // A summary row (past the server's row cap) stands for the events it counts.
  function eventsIn(rows) {
    return rows.reduce(function (sum, row) {
      return sum + (row.hasAttribute("data-summary") ? parseInt(row.dataset.count, 10) : 1);
    }, 0);
  }

  // A status line rewritten with every event would have a screen reader talk without end: it
  // says the count when events start to wait, then at most every SAY_MS.
  var SAY_MS = 15000;
  var saidAt = 0, sayTimer = null;
  function say() {
    sayTimer = null;
    saidAt = Date.now();
    bufferedSaid.textContent = buffered.textContent;
  }
  function showCount() {
    var count = eventsIn(held) + dropped;
    if (!paused || !count) {
      buffered.textContent = bufferedSaid.textContent = "";
      clearTimeout(sayTimer);
      sayTimer = null;
      saidAt = 0;
      return;
    }
    buffered.textContent = count + (count === 1 ? " new event" : " new events") + " while frozen" +
      (dropped ? " (" + dropped + " oldest not kept)" : "");
    if (sayTimer === null) {
      sayTimer = setTimeout(say, Math.max(0, saidAt + SAY_MS - Date.now()));
    }
  }

  function receive(html, position) {
    if (position) { table.dataset.position = position; }
    var rows = rowsOf(html);
    if (!rows.length) { return; }
    if (!paused) {
      show(rows);
      return;
    }
    held = held.concat(rows);
    if (held.length > bufferLimit) {
      dropped += eventsIn(held.slice(0, held.length - bufferLimit));
      held = held.slice(held.length - bufferLimit);
    }
    showCount();
  }

  pauseButton.addEventListener("click", function () {
    paused = !paused;
    pauseButton.textContent = paused ? "Unfreeze view" : "Freeze view";
    pauseButton.setAttribute("aria-pressed", paused ? "true" : "false");
    setConnection(connection.dataset.state, connectionText);
    if (!paused) {
      show(held);
      held = [];
      dropped = 0;
    }
    showCount();
  });

  function showNotice(text) {
    notice.textContent = text;
    notice.hidden = false;
  }

  function listen() {
    var source = new EventSource(withPosition(table.dataset.eventsUrl));
    source.addEventListener("open", function () { setConnection("live", "Live"); });
    source.addEventListener("rows", function (event) { receive(event.data, event.lastEventId); });
    source.addEventListener("position", function (event) { table.dataset.position = event.data; });
    source.addEventListener("notice", function (event) { showNotice(event.data); });
    // The server ended the stream for good (signed out): reconnecting would only be refused.
    source.addEventListener("ended", function (event) {
      source.close();
      showNotice(event.data);
      setConnection("offline", "Ended: sign in again");
    });
    source.addEventListener("error", function () {
      // Reconnect ourselves, so that the URL carries the position the page has now.
      source.close();
      setConnection("offline", "Connection lost, reconnecting");
      setTimeout(listen, 2000);
    });
  }

  function poll() {
    fetch(withPosition(table.dataset.rowsUrl), { credentials: "same-origin" })
      .then(function (response) {
        if (!response.ok) { throw new Error("status " + response.status); }
        var position = response.headers.get("X-Stream-Position");
        return response.text().then(function (html) { receive(html, position); });
      })
      .then(function () { setConnection("polling", "Checked just now (polling)"); },
            function () { setConnection("offline", "Connection lost, retrying"); })
      .then(function () { setTimeout(poll, parseInt(table.dataset.pollMs, 10)); });
  }

  if (table.dataset.mode === "sse") {
    listen();
  } else {
    setConnection("polling", "Polling");
    setTimeout(poll, parseInt(table.dataset.pollMs, 10));
  }
})();
