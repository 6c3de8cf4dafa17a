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

  // An action's form or button is busy while its request runs: pressed once, sent once. A GET
  // (a filter, a preview) changes nothing, and disabling its form's buttons would take the
  // focus from a button tabbed to while the form's change event is being answered.
  function actionButtons(event) {
    var elt = event.detail.elt, config = event.detail.requestConfig;
    if (config && config.verb === "get") { return []; }
    if (elt.tagName === "FORM") { return Array.prototype.slice.call(elt.querySelectorAll("button")); }
    return elt.tagName === "BUTTON" ? [elt] : [];
  }
  // An action whose region the response replaces would drop the keyboard focus to <body>: it
  // goes back to the control of the same words in the new region, else to the action's
  // message there, else to its first control, else to the region itself. Noted before the
  // request, since its buttons are then disabled.
  var focusToRestore = null;
  document.addEventListener("htmx:beforeRequest", function (event) {
    var region = event.detail.target, active = document.activeElement;
    if (region && region.id && active && active !== document.body && region.contains(active)) {
      focusToRestore = {region: region.id, words: active.textContent.trim()};
    }
  });
  document.addEventListener("htmx:afterSettle", function (event) {
    if (!focusToRestore) { return; }
    // Only the settling of the action's own region: another region's refresh can settle while
    // the action's request is still out, and its old buttons are disabled then.
    var region = document.getElementById(focusToRestore.region);
    if (!region || !region.contains(event.target)) { return; }
    var active = document.activeElement;
    var words = focusToRestore.words;
    focusToRestore = null;
    if (active && active !== document.body && document.contains(active)) { return; }
    var controls = Array.prototype.filter.call(
      region.querySelectorAll("button:not([disabled]), a[href], input:not([type=hidden]), select"),
      function (control) { return control.getClientRects().length > 0; });
    var same = controls.filter(function (control) { return control.textContent.trim() === words; });
    // The pressed control is gone (Retry, on an item that is queued again): the focus goes to
    // what the action says it did, rather than to a neighbour such as Cancel.
    var said = region.querySelector(".message[role=status]");
    if (!same[0] && said) { said.tabIndex = -1; }
    var next = same[0] || said || controls[0];
    if (!next) {
      region.tabIndex = -1;
      next = region;
    }
    next.focus();
  });
  // Disabling the focused button drops the focus to <body> when the response goes elsewhere
  // (a filter form's Apply, whose list is replaced): it comes back to the button, unless the
  // response put it somewhere (an autofocused preview heading).
  var busyFocus = null;
  document.addEventListener("htmx:beforeRequest", function (event) {
    var buttons = actionButtons(event);
    if (buttons.indexOf(document.activeElement) >= 0) { busyFocus = document.activeElement; }
    buttons.forEach(function (button) {
      button.disabled = true;
      button.setAttribute("aria-busy", "true");
    });
  });
  document.addEventListener("htmx:afterRequest", function (event) {
    actionButtons(event).forEach(function (button) {
      button.disabled = false;
      button.removeAttribute("aria-busy");
    });
    var button = busyFocus;
    busyFocus = null;
    if (button && document.contains(button) &&
        (!document.activeElement || document.activeElement === document.body)) {
      button.focus();
    }
  });

  // A form whose errors come back into another region (a filter form's list, the bulk
  // preview) is not re-rendered, so its fields are marked here: each error's id is the one
  // Django's widget names in aria-describedby (_form_errors.html). Sending the form again
  // clears the marks; the answer sets them anew. Answers can settle out of order (a change and
  // a submit, a list's own refresh), so each settle also unmarks fields whose error is gone.
  document.addEventListener("htmx:beforeRequest", function (event) {
    var form = event.detail.elt;
    if (form.tagName !== "FORM") { return; }
    form.querySelectorAll("[aria-invalid]").forEach(function (field) {
      field.removeAttribute("aria-invalid");
    });
  });
  document.addEventListener("htmx:afterSettle", function (event) {
    if (!event.target.querySelectorAll) { return; }
    document.querySelectorAll("form [aria-invalid]").forEach(function (field) {
      var error = field.id + "_error";
      if (document.getElementById(error)) { return; }
      field.removeAttribute("aria-invalid");
      var described = (field.getAttribute("aria-describedby") || "").split(/\s+/);
      field.setAttribute("aria-describedby", described.filter(function (id) {
        return id && id !== error;
      }).join(" "));
    });
    event.target.querySelectorAll("[id$='_error']").forEach(function (error) {
      var field = document.getElementById(error.id.slice(0, -"_error".length));
      if (!field || !field.form) { return; }
      field.setAttribute("aria-invalid", "true");
      var described = (field.getAttribute("aria-describedby") || "").split(/\s+/);
      if (described.indexOf(error.id) < 0) {
        field.setAttribute("aria-describedby", described.concat(error.id).join(" ").trim());
      }
    });
  });

  // What a list now holds after the operator filtered or paged it, said once in a status line
  // that is always on the page (the list itself is not a live region: its refreshes would talk).
  document.addEventListener("htmx:afterSettle", function (event) {
    var trigger = event.detail.requestConfig && event.detail.requestConfig.triggeringEvent;
    if (trigger && trigger.type === "queueadmin:tick") { return; }
    var said = event.target.querySelector && event.target.querySelector("[data-announce]");
    var announcer = document.getElementById("announcer");
    if (said && announcer) { announcer.textContent = said.textContent.replace(/\s+/g, " ").trim(); }
  });
  // Plain (non-htmx) posts navigate away: their buttons stay pressed until the next page.
  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (form.method === "post" && !form.hasAttribute("hx-post")) {
      setTimeout(function () {
        form.querySelectorAll("button").forEach(function (b) { b.disabled = true; });
      }, 0);
    }
  });

  // hx-confirm asks in the page's own dialog, not the browser's confirm(); so do shortcuts.
  var confirmed = null;  // what the open question does on "confirm"
  function askInDialog(question, label, then) {
    var dialog = document.getElementById("confirm-dialog");
    document.getElementById("confirm-dialog-text").textContent = question;
    document.getElementById("confirm-dialog-ok").textContent = label || "Confirm";
    dialog.returnValue = "";
    confirmed = then;
    dialog.showModal();
  }
  var confirmDialog = document.getElementById("confirm-dialog");
  if (confirmDialog) {
    confirmDialog.addEventListener("close", function () {
      // A close event is dispatched later than the close itself: one that arrives when the
      // dialog already asks again belongs to the earlier question (answered "Go back").
      if (confirmDialog.open) { return; }
      var then = confirmed;
      confirmed = null;
      if (then && confirmDialog.returnValue === "confirm") { then(); }
    });
  }
  document.addEventListener("htmx:confirm", function (event) {
    var dialog = document.getElementById("confirm-dialog");
    if (!event.detail.question || !dialog || !dialog.showModal) { return; }
    event.preventDefault();
    askInDialog(event.detail.question, event.detail.elt.getAttribute("data-confirm-label"),
                function () { event.detail.issueRequest(true); });
  });

  // A time range is a preset or typed dates, never both: typing a date chooses "From / to",
  // and choosing a preset clears the dates (the server refuses dates beside a preset).
  document.addEventListener("input", function (event) {
    var field = event.target;
    if (!field.matches || !field.matches('input[name="created_from"], input[name="created_to"]') ||
        !field.value || !field.form) { return; }
    var period = field.form.querySelector('select[name="period"]');
    if (period && period.querySelector('option[value="custom"]')) { period.value = "custom"; }
  });
  document.addEventListener("change", function (event) {
    var period = event.target;
    if (!period.matches || !period.matches('select[name="period"]') || !period.form ||
        period.value === "custom") { return; }
    period.form.querySelectorAll('input[name="created_from"], input[name="created_to"]')
      .forEach(function (field) { field.value = ""; });
  });

  // Chromium gives each date field seven Tab stops (its parts and its picker), fourteen that a
  // preset's range never uses: while a preset is chosen and no date is typed, the dates leave
  // the Tab order (still there to click or to type into, which chooses "From / to").
  function dateFieldsInTabOrder(form) {
    var period = form.querySelector('select[name="period"]');
    if (!period || !period.querySelector('option[value="custom"]')) { return; }
    var dates = form.querySelectorAll('input[name="created_from"], input[name="created_to"]');
    var used = period.value === "custom" ||
      Array.prototype.some.call(dates, function (field) { return field.value; });
    dates.forEach(function (field) {
      if (used) { field.removeAttribute("tabindex"); } else { field.setAttribute("tabindex", "-1"); }
    });
  }
  function datesOfForms(root) {
    root.querySelectorAll("form").forEach(dateFieldsInTabOrder);
  }
  ["input", "change"].forEach(function (type) {
    document.addEventListener(type, function (event) {
      if (event.target.form && event.target.matches &&
          event.target.matches('select[name="period"], input[name="created_from"], ' +
                               'input[name="created_to"]')) {
        dateFieldsInTabOrder(event.target.form);
      }
    });
  });
  datesOfForms(document);
  document.addEventListener("htmx:afterSettle", function (event) { datesOfForms(event.target); });

  // A bulk preview answers for the filters it was made from: once they change, its confirm
  // button would still act on the old set (every queued item, where the form now says one
  // account's last hour), so the preview goes until the operator previews again.
  function voidStalePreview(event) {
    if (!event.target.closest || !event.target.closest("#bulk-form")) { return; }
    var preview = document.getElementById("bulk-preview");
    if (!preview || !preview.querySelector("form")) { return; }
    var note = document.createElement("p");
    note.className = "message";
    note.setAttribute("data-preview-void", "");
    note.textContent = "The filters changed: preview again to see what they select.";
    preview.replaceChildren(note);
  }
  document.addEventListener("input", voidStalePreview);
  document.addEventListener("change", voidStalePreview);

  // A link that htmx swaps in place still opens in a new tab or window when asked to (Ctrl,
  // Cmd or Shift held), as any link does: htmx itself lets only boosted links through.
  document.addEventListener("click", function (event) {
    if (!(event.ctrlKey || event.metaKey || event.shiftKey) || !event.target.closest) { return; }
    if (event.target.closest("a[hx-get][href]")) { event.stopPropagation(); }
  }, true);

  // The item list's select-all box selects the page, then offers every matching item.
  document.addEventListener("change", function (event) {
    var box = event.target;
    if (!box.matches || !box.matches("[data-select-page]")) { return; }
    var list = box.closest("section") || document;
    list.querySelectorAll('input[name="ids"]').forEach(function (row) { row.checked = box.checked; });
    list.querySelectorAll("[data-select-more]").forEach(function (more) { more.hidden = !box.checked; });
  });

  // Relative times stay true as the page ages: each time shown by the `when` template tag
  // carries its moment in the datetime attribute, and its relative part (data-relative) is
  // rewritten every second in the server's words (templatetags/queueadmin.py relative_words).
  // "Now" is the server's clock: the page says when it was made (data-now on <body>), so a
  // client clock that is off does not turn "12 s ago" into "in 3 min".
  var clockOffset = (function () {
    var made = parseTime(document.body.dataset.now);
    return isNaN(made) ? 0 : made - Date.now();
  })();

  function parseTime(text) {
    // Python writes microseconds; Date.parse is only required to read milliseconds.
    return Date.parse((text || "").replace(/(\.\d{3})\d+/, "$1"));
  }

  function durationWords(seconds) {
    if (seconds < 10) { return seconds.toFixed(1) + " s"; }
    if (seconds < 60) { return Math.round(seconds) + " s"; }
    if (seconds < 3600) { return Math.floor(seconds / 60) + " min"; }
    if (seconds < 86400) {
      return Math.floor(seconds / 3600) + " h " + Math.floor(seconds % 3600 / 60) + " min";
    }
    return Math.floor(seconds / 86400) + " d " + Math.floor(seconds % 86400 / 3600) + " h";
  }

  function relativeWords(seconds) {
    if (Math.abs(seconds) < 1) { return "now"; }
    var words = durationWords(Math.abs(seconds));
    return seconds > 0 ? "in " + words : words + " ago";
  }

  function refreshRelativeTimes() {
    if (document.visibilityState !== "visible") { return; }
    var now = Date.now() + clockOffset;
    document.querySelectorAll("time[datetime] [data-relative]").forEach(function (el) {
      var moment = parseTime(el.closest("time").getAttribute("datetime"));
      if (!isNaN(moment)) {
        // Inside a live region a time rewritten every second would be read out every second:
        // there screen readers keep the absolute time beside it.
        if (el.closest("[aria-live]")) { el.setAttribute("aria-hidden", "true"); }
        el.textContent = "(" + relativeWords((moment - now) / 1000) + ")";
      }
    });
  }
  setInterval(refreshRelativeTimes, 1000);
  document.addEventListener("visibilitychange", refreshRelativeTimes);

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

  // A table wider than the screen scrolls in its own box; such a box takes the keyboard focus,
  // so that the arrow keys scroll it too.
  function focusableScrollBoxes() {
    document.querySelectorAll(".table-scroll").forEach(function (box) {
      if (box.scrollWidth > box.clientWidth) {
        box.tabIndex = 0;
      } else {
        box.removeAttribute("tabindex");
      }
    });
  }
  focusableScrollBoxes();
  window.addEventListener("resize", focusableScrollBoxes);
  document.addEventListener("htmx:afterSettle", focusableScrollBoxes);

  // The header menu on a phone: its button says whether it is open (the CSS shows it then).
  var menuToggle = document.querySelector(".menu-toggle");
  function setMenu(open) {
    if (menuToggle) { menuToggle.setAttribute("aria-expanded", open ? "true" : "false"); }
  }
  document.addEventListener("click", function (event) {
    if (menuToggle && event.target.closest(".menu-toggle")) {
      setMenu(menuToggle.getAttribute("aria-expanded") !== "true");
    }
    if (event.target.closest("[data-shortcuts-open]")) { openShortcuts(); }
  });

  function openShortcuts() {
    var dialog = document.getElementById("shortcuts-dialog");
    if (!dialog || dialog.open) { return false; }
    dialog.showModal();
    return true;
  }

  // Keyboard shortcuts, listed in #shortcuts-dialog. Elements say which key acts on them
  // (data-shortcut); a field takes the focus, anything else is clicked, after the confirmation
  // dialog when it carries data-shortcut-confirm.
  function runShortcut(keys) {
    var target = document.querySelector('[data-shortcut="' + keys + '"]');
    if (!target) { return false; }
    if (target.matches("input, textarea, select")) {
      var menu = menuToggle && document.getElementById(menuToggle.getAttribute("aria-controls"));
      if (menu && menu.contains(target)) { setMenu(true); }
      target.focus();
      target.select();
    } else if (target.hasAttribute("data-shortcut-confirm")) {
      askInDialog(target.getAttribute("data-shortcut-confirm"),
                  target.getAttribute("data-confirm-label"), function () { target.click(); });
    } else {
      target.click();
    }
    return true;
  }

  // j and k move a selection through the rows of the page's lists: rows that link somewhere.
  // The selected row's first link takes the focus, so Enter opens it and screen readers say it.
  // htmx swaps replace rows, so the selection is kept as that link's address, not as a node.
  var selectedHref = null;
  function listRows() {
    return Array.prototype.filter.call(document.querySelectorAll("main tbody tr"), function (row) {
      return row.querySelector("a[href]") && row.getClientRects().length > 0;
    });
  }
  function markSelected(row) {
    document.querySelectorAll("tr[data-selected]").forEach(function (other) {
      other.removeAttribute("data-selected");
    });
    if (row) { row.setAttribute("data-selected", ""); }
  }
  function moveSelection(step) {
    var rows = listRows();
    if (!rows.length) { return false; }
    var focused = document.activeElement && document.activeElement.closest("main tbody tr");
    var from = rows.indexOf(focused) >= 0 ? focused
                                          : document.querySelector("main tr[data-selected]");
    var at = rows.indexOf(from);
    var next = at < 0 ? (step > 0 ? 0 : rows.length - 1)
                      : Math.min(Math.max(at + step, 0), rows.length - 1);
    var link = rows[next].querySelector("a[href]");
    selectedHref = link.getAttribute("href");
    markSelected(rows[next]);
    link.focus();
    return true;
  }
  document.addEventListener("htmx:afterSettle", function () {
    if (selectedHref === null) { return; }
    markSelected(listRows().filter(function (row) {
      return row.querySelector("a[href]").getAttribute("href") === selectedHref;
    })[0]);
  });

  // Never while the user types, nor with a modifier (those keys belong to the browser), nor
  // while a dialog is open (it has its own keys: Escape closes it).
  var TYPING = "input, textarea, select";
  var INTERACTIVE = "a[href], button, summary, input, textarea, select";
  var SEQUENCE_MS = 1500;
  var gAt = 0;
  document.addEventListener("keydown", function (event) {
    var target = event.target;
    if (event.defaultPrevented || event.ctrlKey || event.metaKey || event.altKey ||
        event.isComposing || !target.closest || target.closest(TYPING) ||
        target.isContentEditable || document.querySelector("dialog[open]")) { return; }
    var afterG = event.key === "q" && Date.now() - gAt < SEQUENCE_MS;
    gAt = event.key === "g" ? Date.now() : 0;
    var handled = false;
    if (afterG) {
      handled = runShortcut("g q");
    } else if (event.key === "/" || event.key === "r") {
      handled = runShortcut(event.key);
    } else if (event.key === "?") {
      handled = openShortcuts();
    } else if (event.key === "j" || event.key === "k") {
      handled = moveSelection(event.key === "j" ? 1 : -1);
    } else if (event.key === "Enter" && !target.closest(INTERACTIVE)) {
      var row = document.querySelector("main tr[data-selected]");
      if (row) { row.querySelector("a[href]").click(); }
      handled = Boolean(row);
    } else if (event.key === "Escape" && menuToggle &&
               menuToggle.getAttribute("aria-expanded") === "true") {
      setMenu(false);
      menuToggle.focus();
      handled = true;
    }
    if (handled) { event.preventDefault(); }
  });
})();
